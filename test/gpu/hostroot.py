"""A container root made of this host's own system, for the GPU container plans.

Usage: hostroot.py ROOTFS
Fills the empty directory ROOTFS with the host's top-level symlinks (/lib -> usr/lib) and
prints, as JSON, what a container over it must bind and set so that python, torch and the
host's CUDA driver work inside it:
  binds: the host directories to bind read-only, non-recursively, parents first: the
         top-level directories python, torch and the driver's libraries are in, and every
         mount below them on its own (a recursive bind would hand CRIU submounts that the
         runtime does not declare external; the GPU machine's driver libraries are one,
         a squashfs at /usr/local/nvidia);
  env:   LD_LIBRARY_PATH with libcuda's directory first, as the host's loader found it;
  devices: the NVIDIA device nodes.
The caller binds the bundle and the exchange directory /x itself.
"""
import ctypes, glob, json, os, site, sys


def host_root(rootfs):
    ld = [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(":") if p]
    cuda = []
    try:
        h = ctypes.CDLL("libcuda.so.1")  # h._handle is its struct link_map: l_addr, l_name
        cuda = [ctypes.cast(h._handle + 8, ctypes.POINTER(ctypes.c_char_p)).contents.value.decode()]
    except OSError as e:
        print(f"no libcuda.so.1 here: {e}", file=sys.stderr)
    maps = {l.split(None, 5)[5].strip() for l in open("/proc/self/maps") if len(l.split(None, 5)) == 6}
    nv = sorted(p for p in maps if p.startswith("/") and ("libcuda" in p or "libnvidia" in p))
    print(f"libcuda.so.1: {cuda} maps {nv}; LD_LIBRARY_PATH={':'.join(ld)}", file=sys.stderr)
    ld = [os.path.dirname(p) for p in cuda] + ld
    top = {"bin", "sbin", "lib", "lib32", "lib64", "libx32", "usr", "etc", "opt"}
    here = os.path.dirname(os.path.abspath(__file__))  # the bundle, bound by the caller
    paths = [sys.executable, site.getuserbase(), *(p for p in sys.path if p != here), *cuda, *maps, *ld]
    top |= {p.split("/")[1] for p in paths if p.startswith("/")}
    binds = []
    for t in sorted(top - {"", "proc", "sys", "dev", "x"}):
        if os.path.islink(f"/{t}"):
            os.symlink(os.readlink(f"/{t}"), f"{rootfs}/{t}")
        elif os.path.isdir(f"/{t}"):
            binds.append(f"/{t}")
    subs = [l.split()[4] for l in open("/proc/self/mountinfo")]
    subs = [m for m in dict.fromkeys(subs) if "\\" not in m and any(m.startswith(t + "/") for t in binds)]
    binds += sorted(subs, key=lambda m: m.count("/"))
    print(f"bound read-only: {' '.join(binds)}", file=sys.stderr)
    env = ["HOME=/x", f"PYTHONUSERBASE={site.getuserbase()}"] + [f"LD_LIBRARY_PATH={':'.join(ld)}"] * bool(ld)
    devices = sorted(d for d in glob.glob("/dev/nvidia*") if not os.path.isdir(d))
    return {"binds": binds, "env": env, "devices": devices, "python": sys.executable}


if __name__ == "__main__":
    json.dump(host_root(sys.argv[1]), sys.stdout)
    print()
