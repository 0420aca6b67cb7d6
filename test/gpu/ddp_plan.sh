#!/usr/bin/env bash
# Two-GPU plan, from the bundle directory as root:
#  A. a plain torchrun DDP job (NCCL defaults): gpucr refuses before locking; the job trains on.
#  B. the same job under `gpucr run`, checkpointed as a whole tree at step 10 of 30, killed and
#     restored, on the same GPUs and then swapped: losses bit-identical to an uninterrupted run.
set -uo pipefail
cd "$(dirname "$0")"
B=$PWD; G="$B/gpucr"; export GPUCR_CRIU=$B/criu/criu NCCL_NVLS_ENABLE=0
W=/dev/shm/gpucr-ddp; rm -rf "$W"; mkdir -p "$W"
pass=0; fail=0
ok()  { echo "PASS $*"; pass=$((pass+1)); }
bad() { echo "FAIL $*"; fail=$((fail+1)); }
wait_all() { for _ in $(seq 1200); do [ -e "$1.0" ] && [ -e "$1.1" ] && return 0; sleep 0.1; done; return 1; }
gone() { ! [ -e /proc/$1 ] || grep -q ') Z ' /proc/$1/stat; }
lines() { wc -l < "$1" 2>/dev/null || echo 0; }

PARTS=" ${*:-A B} "
if [[ "$PARTS" == *" A "* ]]; then
echo "== A. plain torchrun with NCCL defaults"
D=$W/plain; mkdir -p "$D"
setsid torchrun --nproc-per-node 2 --master-port 29551 ddp_train.py "$D" 100000000 </dev/null >/dev/null 2>"$D/err" &
TP=$!
if wait_all "$D/ready"; then
  sleep 1; before=$(lines "$D/losses.0")
  out=$("$G" checkpoint "$TP" -D "$W/img-plain" --tcp-established 2>&1); rc=$?; echo "$out"
  sleep 2; after=$(lines "$D/losses.0")
  if [ $rc -ne 0 ] && echo "$out" | grep -q "NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1" && ! [ -e "$W/img-plain" ] && [ "$after" -gt "$before" ]; then
    ok "A. refused (exit $rc), no image, the job trained on ($before -> $after steps)"
  else bad "A. rc=$rc steps $before -> $after"; fi
else bad "A. job did not start"; tail "$D/err"; fi
kill -9 $(pgrep -P "$TP") "$TP" 2>/dev/null; sleep 2
fi

[[ "$PARTS" == *" B "* ]] || { echo "== $pass passed, $fail failed"; exit 0; }
echo "== B. under gpucr run"
mkdir -p "$W/ref"; "$G" run --nproc-per-node 2 -- python3 ddp_train.py "$W/ref" 30 2>"$W/ref/err" >/dev/null || { bad "reference run"; tail "$W/ref/err"; }
for mode in same swapped; do
  D=$W/$mode; mkdir -p "$D"
  setsid "$G" run --nproc-per-node 2 -- python3 ddp_train.py "$D" 30 10 </dev/null >/dev/null 2>"$D/err" &
  GP=$!
  wait_all "$D/paused" || { bad "$mode: ranks did not reach step 10"; tail "$D/err"; continue; }
  nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv,noheader
  lock=""
  if ! "$G" checkpoint "$GP" -D "$W/img-$mode" --tcp-established --criu-log-level 4; then
    echo "retrying with --network-lock skip (every TCP peer is inside the job)"; lock="--network-lock skip"
    "$G" checkpoint "$GP" -D "$W/img-$mode" --tcp-established $lock || { bad "$mode checkpoint"; kill -9 $(pgrep -P "$GP") "$GP"; continue; }
  fi
  "$G" inspect "$W/img-$mode" | tail -12
  sleep 0.5; gone "$GP" || bad "$mode: launcher still alive"
  # NCCL's listening ports still have TIME_WAIT connections from its bootstrap, made without
  # SO_REUSEADDR: on the same host a restore can bind them only after TCP's 60 s TIME_WAIT.
  sleep 65
  map=""; [ $mode = swapped ] && map="--gpu-map 0=1,1=0"
  "$G" restore -D "$W/img-$mode" $map --criu-log-level 4 || { bad "$mode restore"; gzip -c /tmp/gpucr-restore-*/restore.log > "$OUT/restore-$mode.log.gz"; gzip -c "$W/img-$mode/logs/dump.log" > "$OUT/dump-$mode.log.gz"; continue; }
  nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv,noheader
  touch "$D/go"
  if wait_all "$D/done"; then
    if cmp "$W/ref/losses.0" "$D/losses.0" && cmp "$W/ref/losses.1" "$D/losses.1"; then ok "B. $mode: both ranks' losses of steps 11-30 bit-identical"; else bad "B. $mode: losses differ"; fi
  else bad "B. $mode: job did not finish after restore"; tail -5 "$D/err"; fi
  kill -9 $(pgrep -P "$GP") "$GP" 2>/dev/null; sleep 1
done
echo "== $pass passed, $fail failed"
