#!/usr/bin/env bash
# Probe (two GPUs): what each way of sharing GPU state looks like from outside — threads,
# descriptors, mappings, NVML — to find signals for the restorability analysis; then NCCL
# all-reduce bandwidth with NCCL defaults and over sockets only.
set -uo pipefail
cd "$(dirname "$0")"
export NCCL_NVLS_ENABLE=0
show() { # PID
  local p=$1
  echo "--- pid $p ppid $(awk '{print $4}' /proc/$p/stat) comm $(cat /proc/$p/comm)"
  echo "threads:"; cat /proc/$p/task/*/comm | sed -E 's/[0-9]+/N/g' | sort | uniq -c | sort -rn | head -20
  echo "fds:"; for f in /proc/$p/fd/*; do readlink "$f"; done | sed -E 's/[0-9]+/N/g' | sort | uniq -c | sort -rn | head -20
  echo "nvidia fdinfo (first):"; for f in /proc/$p/fd/*; do case $(readlink "$f") in /dev/nvidia[0-9]*) cat /proc/$p/fdinfo/${f##*/} | tr '\n' ' '; echo; break;; esac; done
  echo "maps (shm/nvidia/anon/memfd, by path):"
  grep -E '/dev/shm|/dev/nvidia|anon_inode|memfd|SYSV|torch' /proc/$p/maps | awk '{print $2, $6}' | sed -E 's/[0-9]+/N/g' | sort | uniq -c | sort -rn | head -20
  echo "environ NCCL/CUDA:"; tr '\0' '\n' </proc/$p/environ | grep -E '^(NCCL|CUDA|PYTORCH)' | head
}
probe() { # MODE
  local D=/dev/shm/probe-$1; rm -rf "$D"; mkdir -p "$D"
  echo "=== $1"
  setsid python3 probe_restorability.py "$1" "$D" </dev/null >"$D/log" 2>&1 &
  for _ in $(seq 900); do [ -e "$D/ready" ] && break; sleep 0.1; done
  [ -e "$D/ready" ] || { echo "not ready"; tail -20 "$D/log"; return; }
  cat "$D/log"
  for p in $(cat "$D/ready"); do show "$p"; done
  nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv,noheader
  ls /dev/shm | grep -v probe | sed -E 's/[0-9a-f]{6,}/X/g' | sort | uniq -c
  pkill -9 -f "probe_restorability.py $1"; sleep 2
}
for m in one host2 peer2 ipc ipc-cumem indep; do probe "$m"; done
echo "=== torchrun NCCL defaults (ranks)"
D=/dev/shm/probe-ddp; rm -rf "$D"; mkdir -p "$D"
setsid torchrun --nproc-per-node 2 --master-port 29517 ddp_train.py "$D" 1000000 1 </dev/null >"$D/log" 2>&1 &
for _ in $(seq 600); do [ -e "$D/paused.0" ] && [ -e "$D/paused.1" ] && break; sleep 0.1; done
for r in 0; do p=$(cat "$D/paused.$r" 2>/dev/null) && show "$p"; done
pkill -9 -f ddp_train.py; pkill -9 -f torchrun; sleep 2
echo "=== torchrun sockets only (ranks)"
rm -rf "$D"; mkdir -p "$D"
NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 setsid torchrun --nproc-per-node 2 --master-port 29518 ddp_train.py "$D" 1000000 1 </dev/null >"$D/log" 2>&1 &
for _ in $(seq 600); do [ -e "$D/paused.0" ] && [ -e "$D/paused.1" ] && break; sleep 0.1; done
for r in 0; do p=$(cat "$D/paused.$r" 2>/dev/null) && show "$p"; done
pkill -9 -f ddp_train.py; pkill -9 -f torchrun; sleep 2
echo "=== all-reduce bandwidth"
echo "-- NCCL defaults"; torchrun --nproc-per-node 2 --master-port 29519 probe_restorability.py allreduce /tmp 2>&1 | grep allreduce
echo "-- sockets only"; NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 torchrun --nproc-per-node 2 --master-port 29520 probe_restorability.py allreduce /tmp 2>&1 | grep allreduce
