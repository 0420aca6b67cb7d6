#!/usr/bin/env bash
# Measures push/pull against a plain local image directory for a CPU process holding 4 GiB of
# mixed memory (1/3 random, 1/3 zeros, 1/3 a repeated 1 MiB block), and the dedup of a second
# checkpoint after 128 MiB of the random part changed. Uses a real MinIO on loopback.
# Run as root after `make build`: bash scripts/measure-storage.sh
set -euo pipefail
cd "$(dirname "$0")/.."
G=bin/gpucr; M=${MINIO:-/var/cache/gpucr-build/minio/bin/minio}
W=$(mktemp -d /var/tmp/gpucr-measure.XXXXXX)
export AWS_ACCESS_KEY_ID=measure AWS_SECRET_ACCESS_KEY=measure-secret GPUCR_S3_ENDPOINT=http://127.0.0.1:9187 AWS_REGION=us-east-1
MINIO_ROOT_USER=$AWS_ACCESS_KEY_ID MINIO_ROOT_PASSWORD=$AWS_SECRET_ACCESS_KEY "$M" server --quiet --address 127.0.0.1:9187 "$W/minio" >"$W/minio.log" 2>&1 &
MP=$!
trap 'kill $MP ${P:-} 2>/dev/null; rm -rf "$W"' EXIT
mkdir -p "$W/minio/bench"  # a top-level directory is a bucket
cat > "$W/mixed.py" <<'PY'
import os, signal, sys, time
n = (4 << 30) // 3 // (1 << 20) * (1 << 20)
rnd = bytearray(os.urandom(n)); zero = bytearray(n); zero[:] = bytes(n)
block = os.urandom(1 << 20); rep = bytearray(block * (n >> 20))
def change(*_): rnd[: 128 << 20] = os.urandom(128 << 20)
signal.signal(signal.SIGUSR1, change)
open(sys.argv[1] + "/ready", "w").write("ok")
while True: time.sleep(1)
PY
setsid python3 "$W/mixed.py" "$W" </dev/null >/dev/null 2>&1 &
P=$!
while [ ! -e "$W/ready" ]; do sleep 0.2; done
# t CMD...: runs CMD, leaves its output in $W/out and its wall time in seconds in $T.
t() { local s; s=$(date +%s.%N); "$@" >"$W/out" 2>&1 || { cat "$W/out"; exit 1; }; T=$(echo "$(date +%s.%N) - $s" | bc); }
echo "nproc $(nproc), process RSS $(awk '/VmRSS/{print $2/1048576 " GiB"}' /proc/$P/status)"
t $G checkpoint $P -D $W/c1 --leave-running; echo "checkpoint 1 to a local directory: $T s, image $(du -sb $W/c1 | cut -f1) bytes"
t $G push $W/c1 s3://bench/ckpt-1 --json; echo "push 1: $T s"; cat "$W/out"
kill -USR1 $P; sleep 1
t $G checkpoint $P -D $W/c2 --leave-running; echo "checkpoint 2: $T s"
t $G push $W/c2 s3://bench/ckpt-2 --json; echo "push 2: $T s"; cat "$W/out"
echo "stored in MinIO: $(du -sb $W/minio/bench | cut -f1) bytes for both checkpoints"
# Streamed: no local image; pages go from CRIU through gpucr's page server to MinIO, under a
# prefix of their own so that the first streamed checkpoint finds no chunks stored.
t $G checkpoint $P --to s3://bench/streamed/ckpt-1 --leave-running --json; echo "streamed checkpoint 1: $T s"; cat "$W/out"
kill -USR1 $P; sleep 1
t $G checkpoint $P --to s3://bench/streamed/ckpt-2 --leave-running --json; echo "streamed checkpoint 2: $T s"; cat "$W/out"
kill -9 $P; wait $P 2>/dev/null || true
t $G pull s3://bench/ckpt-2 $W/p2; echo "pull 2: $T s"
t $G restore -D $W/p2; echo "restore from the pulled image: $T s"; cat "$W/out"
kill -9 "$(cat $W/out | grep -o 'PID [0-9]*' | head -1 | cut -d' ' -f2)" 2>/dev/null || true
sleep 1
t $G restore -D $W/s2 --from s3://bench/streamed/ckpt-2; echo "restore --from the streamed checkpoint: $T s"; cat "$W/out"
