#!/usr/bin/env bash
# Device benchmark for streamed images (issue 18), run as root on the GPU machine from the
# bundle directory (make bundle; it copies this script there):
#   bash bench-stream.sh [GIB] [REPS]        (default: 16 GiB, 2 repetitions)
# A holder (holder.py) keeps GIB GiB of seeded random data on the GPU; every restore is
# verified by the holder (same data, a new kernel runs). Per repetition it measures, wall time:
#   local       checkpoint -D IMG (on /dev/shm), then restore -D IMG
#   restore-from restore --from STORE/push of that same image (pushed, untimed): memory
#                filled straight from the store's chunks
#   ckpt-to     checkpoint --to STORE/stream (no local image), then restore --from it
#   user        today's user path: checkpoint -D on DISK, cp -a of the image (the move to
#               another host), restore -D of the copy
# and prints the ratios the issue asks for: restore --from / local restore and checkpoint --to /
# local checkpoint (target <= 1.3 each), and the user path / (checkpoint --to + restore --from).
# The store is a local store on /dev/shm (STORE, default /dev/shm/gpucr-stream-store): the
# device has no network, and a MinIO server binary does not fit in what a device run carries.
# With a MinIO there, STORE=s3://BUCKET/PREFIX and GPUCR_S3_ENDPOINT plus AWS_* select it.
# Results: a table on stdout, one JSON line per measurement in $OUT/bench-stream.jsonl.
set -uo pipefail
# Restored holders are orphans, and this machine's PID 1 reaps orphans slowly: a zombie holds
# the PID that the next restore of the same image needs. The script runs under a subreaper
# that reaps them at once.
if [ -z "${BENCH_REAPER:-}" ]; then
  exec env BENCH_REAPER=1 python3 "$(dirname "$0")/subreaper.py" bash "$0" "$@"
fi
cd "$(dirname "$0")"
B=$PWD
GIB=${1:-16}; REPS=${2:-2}
export GPUCR_CRIU=${GPUCR_CRIU:-$B/criu/criu}
G="$B/gpucr"
W=/dev/shm/gpucr-bench-stream; DISK=${DISK:-/var/tmp/gpucr-bench-stream}
STORE=${STORE:-/dev/shm/gpucr-stream-store}
OUTD=${OUT:-/tmp/gpucr-out}; mkdir -p "$OUTD"; J=$OUTD/bench-stream.jsonl; : > "$J"
rm -rf "$W" "$DISK"; mkdir -p "$W" "$DISK"
case "$STORE" in s3://*) ;; *) rm -rf "$STORE"; mkdir -p "$STORE";; esac
fail=0
bad() { echo "FAIL $*"; fail=$((fail+1)); }
wait_file() { for _ in $(seq 1800); do [ -e "$1" ] && return 0; sleep 0.1; done; return 1; }

# holder: starts a GIB GiB holder; sets HP (its pid) and HD (its dir).
holder() {
  HD=$W/h; rm -rf "$HD"; mkdir -p "$HD"
  setsid python3 "$B/holder.py" "$GIB" "$HD" </dev/null >/dev/null 2>"$HD/err" &
  wait_file "$HD/ready" || { echo "holder did not start: $(cat "$HD/err")"; exit 1; }
  HP=$(cut -d' ' -f1 "$HD/ready")
}
# verified WHAT: the restored holder must hold the same data and run a new kernel; then it
# is killed. A holder restored from one image twice numbers its results alike: old ones go.
verified() {
  local r=""
  rm -f "$HD"/result*; touch "$HD/verify"
  # The holder opens its result file before writing it: wait for its line.
  for _ in $(seq 1800); do r=$(cat "$HD"/result* 2>/dev/null); [ -n "$r" ] && break; sleep 0.1; done
  case "$r" in *same=True*kernel=True*) ;; *) bad "$1: restored data not verified: $r";; esac
  kill -9 "$HP" 2>/dev/null; for _ in $(seq 600); do [ -e "/proc/$HP" ] || break; sleep 0.05; done
}
# timed NAME CMD...: runs CMD, records its wall time in seconds as $T and in the JSON lines.
timed() {
  local name=$1 s; shift
  s=$(date +%s.%N)
  "$@" > "$OUTD/$name.out" 2>&1 || { bad "$name: $(tail -1 "$OUTD/$name.out")"; T=nan; return 1; }
  T=$(calc "$(date +%s.%N) - $s")
  echo "{\"rep\":$rep,\"gib\":$GIB,\"step\":\"$name\",\"seconds\":$T}" >> "$J"
}
calc() { python3 -c 'import sys; print(round(eval(sys.argv[1]), 2))' "$1" 2>/dev/null || echo nan; }
ratio() { calc "$1 / $2"; }

echo "== host"; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; "$G" --version
printf '%-4s %10s %10s %10s %10s %10s %10s %10s\n' rep ckpt-local rst-local rst-from ckpt-to rst-from2 user ratios
for rep in $(seq "$REPS"); do
  holder
  timed ckpt-local "$G" checkpoint "$HP" -D "$W/img" --json; CL=$T
  timed rst-local "$G" restore -D "$W/img" --json && verified "local restore"; RL=$T
  "$G" push "$W/img" "$STORE/push-$rep/img" >/dev/null || bad "push"
  rm -rf "$W/img"
  timed rst-from "$G" restore --from "$STORE/push-$rep/img" --json && verified "restore --from a pushed image"; RF=$T
  cat "$OUTD/rst-from.out" > "$OUTD/rst-from-$rep.json"
  "$G" rm "$STORE/push-$rep/img" >/dev/null

  holder
  timed ckpt-to "$G" checkpoint "$HP" --to "$STORE/stream-$rep/ckpt" --json; CT=$T
  timed rst-from2 "$G" restore --from "$STORE/stream-$rep/ckpt" --json && verified "restore --from a streamed checkpoint"; RF2=$T
  "$G" rm "$STORE/stream-$rep/ckpt" >/dev/null

  holder
  timed user-ckpt "$G" checkpoint "$HP" -D "$DISK/a" --json; U1=$T
  timed user-copy cp -a "$DISK/a" "$DISK/b"; U2=$T
  timed user-restore "$G" restore -D "$DISK/b" --json && verified "today's user path"; U3=$T
  rm -rf "$DISK/a" "$DISK/b"
  U=$(calc "$U1 + $U2 + $U3")
  printf '%-4s %10s %10s %10s %10s %10s %10s  restore-from/local %s, ckpt-to/local %s, user/(ckpt-to+restore-from) %s\n' \
    "$rep" "$CL" "$RL" "$RF" "$CT" "$RF2" "$U" "$(ratio "$RF" "$RL")" "$(ratio "$CT" "$CL")" "$(ratio "$U" "$(calc "$CT + $RF2")")"
done
echo "streamed restore of the last repetition:"; cat "$OUTD/rst-from-$REPS.json"
rm -rf "$W" "$DISK"
[ "$fail" = 0 ] && echo "PASS every restore verified" || { echo "FAIL $fail"; exit 1; }
