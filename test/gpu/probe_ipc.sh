#!/usr/bin/env bash
# Probe (two GPUs): what a torchrun/NCCL job's ranks show from outside, with NCCL defaults
# and with NCCL over sockets, to find a signal for jobs the driver cannot restore.
set -uo pipefail
cd "$(dirname "$0")"
export NCCL_NVLS_ENABLE=0
probe() {
  local name=$1; shift
  local D=/dev/shm/probe-$name; rm -rf "$D"; mkdir -p "$D"
  echo "=== $name: $*"
  env "$@" setsid torchrun --nproc-per-node 2 --master-port 29517 ddp_train.py "$D" 1000000 1 </dev/null >"$D/log" 2>&1 &
  for _ in $(seq 600); do [ -e "$D/paused.0" ] && [ -e "$D/paused.1" ] && break; sleep 0.1; done
  for r in 0 1; do
    p=$(cat "$D/paused.$r" 2>/dev/null) || { echo "rank $r did not start"; tail -20 "$D/log"; continue; }
    echo "--- rank $r pid $p ppid $(awk '{print $4}' /proc/$p/stat)"
    echo "maps: shm/nvidia/anon-inode lines (deduped paths):"
    grep -E '/dev/shm|/dev/nvidia|anon_inode|memfd|SYSV' /proc/$p/maps | awk '{print $2, $6, $7}' | sort | uniq -c | sort -rn | head -25
    echo "fds:"; for f in /proc/$p/fd/*; do readlink "$f"; done | sed -E 's/[0-9]+/N/g' | sort | uniq -c | sort -rn | head -25
  done
  nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv,noheader
  ls -la /dev/shm | grep -v probe | head
  pkill -9 -f ddp_train.py; pkill -9 -f torchrun; sleep 2
}
probe default
probe sockets NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1
probe nop2p NCCL_P2P_DISABLE=1
probe noshm NCCL_SHM_DISABLE=1
