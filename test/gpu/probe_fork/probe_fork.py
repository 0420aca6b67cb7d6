"""A torch process with a 1 GiB tensor and a forked multiprocessing child: prints the NVIDIA
descriptors and mappings of each (device run 122)."""
import os, sys, time, torch, multiprocessing as mp
def worker(q):
    q.put(os.getpid()); time.sleep(600)
if __name__ == "__main__":
    x = torch.ones(1 << 28, device="cuda")
    ctx = mp.get_context("fork"); q = ctx.Queue()
    p = ctx.Process(target=worker, args=(q,)); p.start()
    child = q.get()
    for who, pid in (("parent", os.getpid()), ("child", child)):
        fds = {}
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try: t = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError: continue
            if "nvidia" in t: fds.setdefault(t, []).append(int(fd))
        maps = {}
        for line in open(f"/proc/{pid}/maps"):
            parts = line.split()
            if len(parts) >= 6 and "nvidia" in parts[5]:
                maps[(parts[5], parts[1])] = maps.get((parts[5], parts[1]), 0) + 1
        print(who, pid, "fds", {k: len(v) for k, v in fds.items()}, "maps", maps, flush=True)
    print("READY", os.getpid(), child, flush=True)
    sys.stdout.flush(); time.sleep(600)
