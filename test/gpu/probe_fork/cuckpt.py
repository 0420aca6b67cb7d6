"""Locks and checkpoints (ckpt), or restores and unlocks (rst), PID through the CUDA driver API."""
import ctypes, sys
cu = ctypes.CDLL("libcuda.so.1")
pid = int(sys.argv[2])
for name in {"ckpt": ["cuCheckpointProcessLock", "cuCheckpointProcessCheckpoint"], "rst": ["cuCheckpointProcessRestore", "cuCheckpointProcessUnlock"]}[sys.argv[1]]:
    r = getattr(cu, name)(ctypes.c_int(pid), None)
    print(name, r, flush=True)
