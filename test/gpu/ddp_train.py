"""Deterministic two-rank DDP training under torchrun: losses must be bit-identical across
checkpoint/restore.

Usage: torchrun --nproc-per-node 2 ddp_train.py DIR STEPS [PAUSE_AT]
Each rank writes its step losses as float.hex() to DIR/losses.RANK. With PAUSE_AT, after that
step every rank writes DIR/paused.RANK (its pid) and waits for DIR/go: the checkpoint is
taken there. DIR/ready.RANK is written once NCCL has run its first all-reduce.
"""
import os, sys, time
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

d, steps = sys.argv[1], int(sys.argv[2])
pause = int(sys.argv[3]) if len(sys.argv) > 3 else -1
dist.init_process_group("nccl")
r = dist.get_rank(); torch.cuda.set_device(r)
torch.manual_seed(0); torch.cuda.manual_seed_all(0)
torch.use_deterministic_algorithms(True)
torch.backends.cuda.matmul.allow_tf32 = False
model = DDP(torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 10)).cuda(), device_ids=[r])
opt = torch.optim.SGD(model.parameters(), lr=0.05)
g = torch.Generator(device="cuda"); g.manual_seed(100 + r)
data = torch.randn(2048, 256, device="cuda", generator=g)
labels = torch.randint(0, 10, (2048,), device="cuda", generator=g)
t = torch.ones(1, device="cuda"); dist.all_reduce(t); torch.cuda.synchronize()
open(f"{d}/ready.{r}", "w").write(f"{os.getpid()}\n")
for step in range(1, steps + 1):
    idx = torch.randint(0, 2048, (128,), device="cuda", generator=g)
    loss = torch.nn.functional.cross_entropy(model(data[idx]), labels[idx])
    opt.zero_grad(set_to_none=True); loss.backward(); opt.step()
    with open(f"{d}/losses.{r}", "a") as f:
        f.write(f"{step} {loss.item().hex()}\n")
    if step == pause:
        torch.cuda.synchronize()
        open(f"{d}/paused.{r}", "w").write(f"{os.getpid()}\n")
        while not os.path.exists(f"{d}/go"):
            time.sleep(0.05)
dist.barrier()
open(f"{d}/done.{r}", "w").write("done\n")
dist.destroy_process_group()
