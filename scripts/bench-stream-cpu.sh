#!/usr/bin/env bash
# Local benchmark of the streamed restore (issue 18) that needs no GPU, run as root from the
# repository after make build:
#   bash scripts/bench-stream-cpu.sh [GIB] [REPS]        (default: 2 GiB, 3 repetitions)
# The counter workload holds GIB GiB of seeded random 64-bit values (-random-mib: the data
# test/gpu/holder.py keeps on the GPU, on the CPU) and is checkpointed once to /dev/shm; the
# image is pushed to a local store on /dev/shm. Each repetition then restores it with
# restore -D IMG and restore --from STORE, in turn, every restore verified by the counter
# (it re-checks all its memory), and prints the memory-fill phase and the whole restore of
# each, and their ratios. PROFILE=DIR keeps a CPU profile of each restore --from there
# (go tool pprof bin/gpucr DIR/from-N.pprof). GPUCR and COUNTER name other binaries;
# RUN_DIR journals elsewhere than /run/gpucr (on a machine others run gpucr on too).
set -euo pipefail
# Restored counters are orphans: the script runs under a subreaper that reaps them at once,
# so that no zombie holds the PID the next restore needs.
if [ -z "${BENCH_REAPER:-}" ]; then
  exec env BENCH_REAPER=1 python3 "$(dirname "$0")/subreaper.py" bash "$0" "$@"
fi
cd "$(dirname "$0")/.."
GIB=${1:-2}; REPS=${2:-3}
G=${GPUCR:-$PWD/bin/gpucr}; C=${COUNTER:-$PWD/bin/counter}
run=(${RUN_DIR:+--run-dir "$RUN_DIR"})
W=/dev/shm/gpucr-bench-stream-cpu
rm -rf "$W"; mkdir -p "$W/h"
trap 'rm -rf "$W"' EXIT
wait_file() { for _ in $(seq 1200); do [ -s "$1" ] && return 0; sleep 0.05; done; echo "no $1" >&2; exit 1; }
# verified PID WHAT: the restored counter re-checks its memory, then is killed.
verified() {
  rm -f "$W/h/verify"; kill -USR1 "$1"; wait_file "$W/h/verify"
  grep -q '^ok' "$W/h/verify" || { echo "FAIL $2: $(cat "$W/h/verify")"; exit 1; }
  kill -9 "$1"; for _ in $(seq 600); do [ -e "/proc/$1" ] || break; sleep 0.05; done
}
# phases FILE: the memory-fill phase and the total of a restore's JSON.
phases() {
  python3 -c 'import json, sys
o = json.load(open(sys.argv[1]))
fill = sum(p["seconds"] for p in o["phases"] if p["name"] == "memory-fill")
print("%.2f %.2f" % (fill, o["totalSeconds"]))' "$1"
}
calc() { python3 -c 'import sys; print(round(eval(sys.argv[1]), 2))' "$1"; }

setsid "$C" -dir "$W/h" -random-mib $((GIB * 1024)) </dev/null >/dev/null 2>&1 &
pid=$!
wait_file "$W/h/count"
"$G" checkpoint "$pid" -D "$W/img" --json "${run[@]}" > "$W/ckpt.json"
"$G" push "$W/img" "$W/store/ckpt" > /dev/null
echo "== $(nproc) cores, $GIB GiB of random data, $("$G" --version)"
printf '%-4s %14s %14s %14s %14s %8s %8s\n' rep fill-local rst-local fill-from rst-from fill× rst×
for rep in $(seq "$REPS"); do
  "$G" restore -D "$W/img" --json "${run[@]}" > "$W/local.json"; verified "$pid" "restore -D"
  read -r FL RL < <(phases "$W/local.json")
  prof=()
  [ -n "${PROFILE:-}" ] && mkdir -p "$PROFILE" && prof=(--cpu-profile "$PROFILE/from-$rep.pprof")
  "$G" restore --from "$W/store/ckpt" --json "${run[@]}" "${prof[@]}" > "$W/from.json"; verified "$pid" "restore --from"
  read -r FF RF < <(phases "$W/from.json")
  printf '%-4s %14s %14s %14s %14s %8s %8s\n' "$rep" "$FL" "$RL" "$FF" "$RF" "$(calc "$FF / $FL")" "$(calc "$RF / $RL")"
done
echo "PASS every restore verified"
