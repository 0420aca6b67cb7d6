"""Probe workloads for the restorability analysis: each mode sets up one way GPU processes
can share state, then writes DIR/ready with the PIDs of its GPU processes and waits.

Usage: probe_restorability.py MODE DIR
Modes: one (one GPU), host2 (two GPUs, copies through host memory), peer2 (two GPUs, peer
copies), ipc (torch.multiprocessing CUDA IPC to a spawned child), ipc-cumem (the same with
expandable segments: cuMem shareable handles), indep (two independent GPU processes in one
tree), allreduce (NCCL all-reduce bus bandwidth, run under torchrun; prints results).
"""
import os, subprocess, sys, time

mode, d = sys.argv[1], sys.argv[2]
if mode == "ipc-cumem":
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
import torch


def ready(pids, check=lambda: True):
    """Announces pids, then answers each DIR/verify with DIR/resultK: same=CHECK() pid=PID."""
    with open(os.path.join(d, "ready.tmp"), "w") as f:
        f.write(" ".join(str(p) for p in pids))
    os.rename(os.path.join(d, "ready.tmp"), os.path.join(d, "ready"))
    k = 0
    while True:
        v = os.path.join(d, "verify")
        if os.path.exists(v):
            os.remove(v)
            k += 1
            # Renamed into place whole: the plan reads a result as soon as it exists, and
            # read an empty one while a first check on two GPUs was still running.
            out = os.path.join(d, "result%d" % k)
            with open(out + ".tmp", "w") as f:
                f.write("same=%s pid=%d" % (check(), os.getpid()))
            os.rename(out + ".tmp", out)
        time.sleep(0.1)


def child_ipc(q, done):
    t = q.get()  # a CUDA tensor opened through CUDA IPC
    torch.cuda.synchronize()
    with open(os.path.join(d, "child"), "w") as f:
        f.write("%d %d" % (os.getpid(), int(t.sum().item())))
    done.wait()


if __name__ == "__main__":
    if mode == "one":
        x = torch.arange(1 << 20, device="cuda:0", dtype=torch.float32); torch.cuda.synchronize()
        want = float(x.sum().item())
        ready([os.getpid()], lambda: float(x.sum().item()) == want)
    elif mode in ("host2", "peer2"):
        a = torch.arange(1 << 20, device="cuda:0", dtype=torch.float32)
        if mode == "peer2":
            print("can_device_access_peer", torch.cuda.can_device_access_peer(0, 1), flush=True)
            b = a.to("cuda:1")  # device to device: PyTorch enables peer access when it can
        else:
            b = a.cpu().to("cuda:1")
        torch.cuda.synchronize()
        want = float(a.sum().item())
        assert float(b.sum().item()) == want
        ready([os.getpid()], lambda: float(a.sum().item()) == want and float(b.sum().item()) == want and
              float((b + 1).sum().item()) == want + b.numel())
    elif mode in ("ipc", "ipc-cumem"):
        import torch.multiprocessing as mp
        ctx = mp.get_context("spawn")
        q, done = ctx.Queue(), ctx.Event()
        p = ctx.Process(target=child_ipc, args=(q, done))
        p.start()
        t = torch.arange(1 << 20, device="cuda:0", dtype=torch.float32)
        q.put(t)
        while not os.path.exists(os.path.join(d, "child")):
            time.sleep(0.1)
        ready([os.getpid(), p.pid])
    elif mode == "indep":
        x = torch.arange(1 << 20, device="cuda:0", dtype=torch.float32); torch.cuda.synchronize()
        want = float(x.sum().item())
        c = subprocess.Popen([sys.executable, "-c",
                              "import torch,time,sys; x=torch.ones(1<<20,device='cuda:0'); torch.cuda.synchronize();"
                              "open(sys.argv[1],'w').write('1'); time.sleep(1e6)", os.path.join(d, "child")])
        while not os.path.exists(os.path.join(d, "child")):
            time.sleep(0.1)
        ready([os.getpid(), c.pid], lambda: float(x.sum().item()) == want and c.poll() is None)
    elif mode == "allreduce":
        import torch.distributed as dist
        dist.init_process_group("nccl")
        r, w = dist.get_rank(), dist.get_world_size()
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        for mib in (64, 1024):
            x = torch.ones(mib << 18, device="cuda")  # float32
            for _ in range(3):
                dist.all_reduce(x)
            torch.cuda.synchronize(); dist.barrier()
            n = 20 if mib == 64 else 5
            t0 = time.perf_counter()
            for _ in range(n):
                dist.all_reduce(x)
            torch.cuda.synchronize()
            dt = (time.perf_counter() - t0) / n
            busbw = (mib << 20) / dt * 2 * (w - 1) / w / 1e9
            if r == 0:
                print("allreduce %d MiB: %.2f ms, bus bandwidth %.1f GB/s" % (mib, dt * 1e3, busbw), flush=True)
        dist.destroy_process_group()
