#!/usr/bin/env bash
# N GPU processes in the time of one, on the device machine, from the bundle directory as root:
#   bash multi_plan.sh [GIB] [COUNTS] [REPS]   (default 4 GiB, "1 2 4", 2 reps)
# For each count N a bash parent starts N holders of GIB GiB each (every one on GPU
# $CUDA_VISIBLE_DEVICES's first device unless MULTI_SPREAD=1 puts holder i on GPU i mod the
# GPUs there are) and waits for them. The tree is checkpointed to /dev/shm with gpucr (the
# root is the parent) and restored, REPS times; every holder re-checks its data after each
# restore. Printed per N: median checkpoint and restore wall time, and each against N=1's
# median in the same run: the issue's target is <= 1.15x.
set -uo pipefail
cd "$(dirname "$0")"
# Restored trees are orphans of their restore: this plan is their subreaper, so that a
# checkpointed tree's PIDs are free again at once for the next restore.
if [ -z "${MULTI_REAPER:-}" ]; then
  MULTI_REAPER=1 exec python3 "$(dirname "$0")/subreaper.py" bash "$0" "$@"
fi
B=$PWD
export GPUCR_CRIU=$B/criu/criu
G="$B/gpucr"
GIB=${1:-4}; COUNTS=${2:-"1 2 4"}; REPS=${3:-2}
W=/dev/shm/gpucr-multi
rm -rf "$W"; mkdir -p "$W"
pass=0; fail=0
ok()  { echo "PASS $*"; pass=$((pass+1)); }
bad() { echo "FAIL $*"; fail=$((fail+1)); }
wait_file() { for _ in $(seq 1800); do [ -e "$1" ] && return 0; sleep 0.1; done; return 1; }
now() { date +%s.%N; }
GPUS=$(nvidia-smi -L | wc -l)
declare -A CK RS

for n in $COUNTS; do
  T=$W/n$n; mkdir -p "$T"
  launch=""
  for i in $(seq "$n"); do
    dev=0; [ "${MULTI_SPREAD:-0}" = 1 ] && dev=$(( (i - 1) % GPUS ))
    mkdir -p "$T/h$i"
    launch+="CUDA_VISIBLE_DEVICES=$dev python3 $B/holder.py $GIB $T/h$i 2>$T/h$i/err & "
  done
  HERR=$T/parent.err python3 "$B/reaper.py" bash -c "${launch}wait" &
  RP=$!
  for i in $(seq "$n"); do wait_file "$T/h$i/ready" || { bad "n=$n holder $i did not start: $(cat "$T/h$i/err")"; continue 2; }; done
  ROOT=$(ps -o ppid= -p "$(cut -d' ' -f1 "$T/h1/ready")" | tr -d ' ')
  k=0
  cks=(); rss=()
  for rep in $(seq "$REPS"); do
    rm -rf "$T/img"
    t0=$(now)
    out=$("$G" checkpoint "$ROOT" -D "$T/img" --json 2>"$T/ck.err") || { bad "n=$n rep $rep checkpoint: $(tail -3 "$T/ck.err")"; break; }
    t1=$(now)
    echo "n=$n rep $rep checkpoint $(python3 -c 'import json,sys; o=json.loads(sys.argv[1]); print("%.2fs gpuProcesses=%s gpuMemory=%.1fGiB phases %s" % (o["totalSeconds"], o.get("gpuProcesses"), o.get("gpuMemoryBytes",0)/2**30, " ".join("%s=%.2f" % (p["name"], p["seconds"]) for p in o["phases"])))' "$out")"
    sleep 0.5
    t2=$(now)
    out=$("$G" restore -D "$T/img" --json 2>"$T/rs.err") || { bad "n=$n rep $rep restore: $(tail -3 "$T/rs.err")"; break; }
    t3=$(now)
    echo "n=$n rep $rep restore $(python3 -c 'import json,sys; o=json.loads(sys.argv[1]); print("%.2fs phases %s" % (o["totalSeconds"], " ".join("%s=%.2f" % (p["name"], p["seconds"]) for p in o["phases"])))' "$out")"
    k=$((k+1)); good=1
    for i in $(seq "$n"); do touch "$T/h$i/verify"; done
    for i in $(seq "$n"); do
      if wait_file "$T/h$i/result$k"; then
        case "$(cat "$T/h$i/result$k")" in *same=True*kernel=True*) ;; *) good=0; echo "holder $i: $(cat "$T/h$i/result$k")";; esac
      else good=0; echo "holder $i gave no result"; fi
    done
    [ "$good" = 1 ] && ok "n=$n rep $rep: all $n holders restored with their data" || bad "n=$n rep $rep data"
    cks+=("$(awk "BEGIN {print $t1 - $t0}")"); rss+=("$(awk "BEGIN {print $t3 - $t2}")")
  done
  med() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
  [ "${#cks[@]}" -gt 0 ] && { CK[$n]=$(med "${cks[@]}"); RS[$n]=$(med "${rss[@]}"); }
  pkill -9 -f "holder.py $GIB $T/" 2>/dev/null; kill -9 "$RP" 2>/dev/null; sleep 1
done

first=${COUNTS%% *}
echo "== $GIB GiB per process, wall seconds (median of $REPS), ratio to n=$first"
for n in $COUNTS; do
  [ -n "${CK[$n]:-}" ] || continue
  awk -v n="$n" -v c="${CK[$n]}" -v c1="${CK[$first]}" -v r="${RS[$n]}" -v r1="${RS[$first]}" \
    'BEGIN {printf "n=%s checkpoint %.2f s (%.2fx)  restore %.2f s (%.2fx)\n", n, c, c / c1, r, r / r1}'
done
rm -rf "$W"
echo "multi plan: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
