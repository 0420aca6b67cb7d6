"""JAX test workload: holds an array on the GPU and rechecks it on demand.

Usage: XLA_PYTHON_CLIENT_PREALLOCATE=false jax_holder.py DIR
Writes DIR/ready (its pid) once the array is on the GPU; answers each DIR/verify with
DIR/resultK: "same=True|False pid=PID" after a fresh computation on the GPU.
"""
import os, sys, time
import jax, jax.numpy as jnp

d = sys.argv[1]
x = jnp.arange(1 << 24, dtype=jnp.float32)
want = float(jnp.sum(x))
open(os.path.join(d, "ready"), "w").write("%d" % os.getpid())
k = 0
while True:
    if os.path.exists(os.path.join(d, "verify")):
        os.remove(os.path.join(d, "verify"))
        k += 1
        same = float(jnp.sum(x)) == want and float(jnp.sum(x * 2)) == 2 * want
        out = os.path.join(d, "result%d" % k)  # renamed into place whole, as the plan reads it at once
        open(out + ".tmp", "w").write("same=%s pid=%d device=%s" % (same, os.getpid(), x.devices()))
        os.rename(out + ".tmp", out)
    time.sleep(0.1)
