"""Deterministic GPU training loop: losses must be bit-identical across checkpoint/restore.

Usage: train.py DIR STEPS [PAUSE_AT [WORKERS [START_METHOD]]]
Writes each step's loss as float.hex() to DIR/losses. With PAUSE_AT it stops after that step,
writes DIR/paused, and waits for DIR/go before going on: the checkpoint is taken there.
With WORKERS > 0 the batches come from a PyTorch DataLoader with that many worker processes,
pinning memory, as a training script's usually do; they are forked after CUDA started (the
default on Linux before Python 3.14), or started by START_METHOD (spawn, forkserver).
"""
import os, sys, time
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
import torch


def main():
    d, steps = sys.argv[1], int(sys.argv[2])
    pause = int(sys.argv[3]) if len(sys.argv) > 3 else -1
    workers = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    method = sys.argv[5] if len(sys.argv) > 5 else None
    torch.manual_seed(0); torch.cuda.manual_seed_all(0)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = "cuda"
    model = torch.nn.Sequential(
        torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 10)
    ).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.randn(4096, 512, device=dev)
    labels = torch.randint(0, 10, (4096,), device=dev)
    with open(f"{d}/losses", "a") as f:
        pass

    def batches():
        """Index batches: drawn on the GPU, or from a DataLoader's workers over a CPU copy."""
        if workers == 0:
            while True:
                idx = torch.randint(0, 4096, (256,), device=dev)
                yield data[idx], labels[idx]
        ds = torch.utils.data.TensorDataset(data.cpu(), labels.cpu())
        loader = torch.utils.data.DataLoader(ds, batch_size=256, shuffle=True, num_workers=workers, pin_memory=True,
                                             persistent_workers=True, generator=torch.Generator().manual_seed(1),
                                             multiprocessing_context=method)
        while True:
            for x, y in loader:
                yield x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)

    source = batches()
    for step in range(1, steps + 1):
        x, y = next(source)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        with open(f"{d}/losses", "a") as f:
            f.write(f"{step} {loss.item().hex()}\n")
        if step == pause:
            torch.cuda.synchronize()
            open(f"{d}/paused", "w").write(f"{os.getpid()}\n")
            while not os.path.exists(f"{d}/go"):
                time.sleep(0.05)
    open(f"{d}/done", "w").write("done\n")


if __name__ == "__main__":  # spawned DataLoader workers import this file again
    main()
