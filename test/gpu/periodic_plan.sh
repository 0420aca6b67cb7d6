#!/usr/bin/env bash
# Periodic checkpoints on the device machine, from the bundle directory as root:
#   bash periodic_plan.sh [GIB] [REPS]   (default 16 GiB, 3 reps)
# A holder of GIB GiB of GPU memory is checkpointed REPS times with --leave-running to
# /dev/shm and once to disk: each time the pause (GPU lock to running again) and the total
# are printed, and the holder re-checks its data; the last image is then restored after the
# holder is killed, and its data checked.
set -uo pipefail
cd "$(dirname "$0")"
B=$PWD
export GPUCR_CRIU=$B/criu/criu
G="$B/gpucr"
GIB=${1:-16}; REPS=${2:-3}
W=/dev/shm/gpucr-periodic; D=/var/tmp/gpucr-periodic
rm -rf "$W" "$D"; mkdir -p "$W" "$D"
pass=0; fail=0
ok()  { echo "PASS $*"; pass=$((pass+1)); }
bad() { echo "FAIL $*"; fail=$((fail+1)); }
wait_file() { for _ in $(seq 1200); do [ -e "$1" ] && return 0; sleep 0.1; done; return 1; }
HD=$W/holder; mkdir -p "$HD"
setsid python3 "$B/holder.py" "$GIB" "$HD" </dev/null >/dev/null 2>"$HD/err" &
wait_file "$HD/ready" || { echo "holder did not start: $(cat "$HD/err")"; exit 1; }
HP=$(cut -d' ' -f1 "$HD/ready")
k=0
check() { k=$((k+1)); touch "$HD/verify"; wait_file "$HD/result$k" && cat "$HD/result$k"; }
# one WHERE TAG: a --leave-running checkpoint to WHERE/TAG, its pause and total, the data after
one() {
  out=$("$G" checkpoint "$HP" -D "$1/$2" --leave-running --json) || { bad "$2 checkpoint"; return; }
  python3 -c 'import json,sys; o=json.loads(sys.argv[1]); print("%s paused %.2fs of %.2fs; phases %s" % (sys.argv[2], o["pausedSeconds"], o["totalSeconds"], " ".join("%s=%.2f" % (p["name"], p["seconds"]) for p in o["phases"])))' "$out" "$2"
  r=$(check); case "$r" in *same=True*kernel=True*) ok "$2 runs on with its data: $r";; *) bad "$2 data: $r";; esac
}
for i in $(seq "$REPS"); do one "$W" "shm$i"; [ "$i" -lt "$REPS" ] && rm -rf "$W/shm$i"; done
one "$D" disk
kill -9 "$HP"; sleep 0.5; rm -f "$HD"/result*; k=0
"$G" restore -D "$D/disk" >/dev/null && r=$(check) &&
  case "$r" in *same=True*) ok "the disk image restores: $r";; *) bad "restore: $r";; esac || bad "restore"
kill -9 "$HP" 2>/dev/null; rm -rf "$W" "$D"
echo "periodic plan: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
