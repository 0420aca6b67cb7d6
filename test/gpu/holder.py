"""GPU test workload: holds GIB GiB of seeded random data on the GPU and re-checks it on demand.

Usage: holder.py GIB DIR [--connect PORT] [--fork | --spawn]
Writes DIR/ready ("pid digest") once the data is on the GPU. Each time DIR/verify appears it
removes it, recomputes the digest on the GPU, runs a fresh kernel, and writes DIR/resultK:
"same=True|False device=<uuid> pid=<pid>". With --connect it holds a TCP connection open
(used to make CRIU refuse the dump without --tcp-established). With --fork, once the data is
on the GPU, it forks a child that shares its memory copy-on-write and never touches CUDA, as
a DataLoader worker does; with --spawn the child is a new python process instead, as with the
spawn start method. The child writes DIR/child ("pid ticks") and exits with its parent.
"""
import os, socket, subprocess, sys, time
import torch

gib, d = float(sys.argv[1]), sys.argv[2]
conn = None
if "--connect" in sys.argv:
    conn = socket.create_connection(("127.0.0.1", int(sys.argv[sys.argv.index("--connect") + 1])))
n = int(gib * (1 << 30) // 8)
g = torch.Generator(device="cuda"); g.manual_seed(1234)
x = torch.randint(-2**62, 2**62, (n,), dtype=torch.int64, device="cuda", generator=g)

def digest():
    s = 0
    for c in x.split(1 << 26):
        s ^= int((c * 2654435761).sum().item())
    return s

def uuid():
    try:
        return str(torch.cuda.get_device_properties(0).uuid)
    except Exception as e:  # older torch
        return "unknown:" + type(e).__name__

d0 = digest(); torch.cuda.synchronize(); torch.cuda.empty_cache()
CHILD = """
import os, sys, time
d, parent, t = sys.argv[1], int(sys.argv[2]), 0
while os.getppid() == parent:
    t += 1
    open(f"{d}/child.tmp", "w").write(f"{os.getpid()} {t}\\n"); os.rename(f"{d}/child.tmp", f"{d}/child")
    time.sleep(0.2)
"""
if "--fork" in sys.argv:
    parent = os.getpid()
    if os.fork() == 0:
        sys.argv = ["child", d, str(parent)]
        exec(CHILD)
        os._exit(0)
if "--spawn" in sys.argv:
    subprocess.Popen([sys.executable, "-c", CHILD, d, str(os.getpid())], stdin=subprocess.DEVNULL)
open(f"{d}/ready.tmp", "w").write(f"{os.getpid()} {d0}\n"); os.rename(f"{d}/ready.tmp", f"{d}/ready")
k = 0
while True:
    if os.path.exists(f"{d}/verify"):
        os.unlink(f"{d}/verify"); k += 1
        same = digest() == d0
        y = (x[: 1 << 20] * 3).sum().item()  # a new kernel after restore
        torch.cuda.synchronize()
        open(f"{d}/result{k}", "w").write(f"same={same} device={uuid()} pid={os.getpid()} kernel={y != 0}\n")
    time.sleep(0.05)
