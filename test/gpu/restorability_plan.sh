#!/usr/bin/env bash
# The restorability matrix (two GPUs), from the bundle directory as root: each case is
# checkpointed and restored with its data checked, or refused with its check named and the
# workload left running and correct. Prints PASS/FAIL per case. On one GPU, the cases that
# need two are left out.
set -uo pipefail
cd "$(dirname "$0")"
B=$PWD
export GPUCR_CRIU=$B/criu/criu NCCL_NVLS_ENABLE=0
G="$B/gpucr"
W=/dev/shm/gpucr-rplan; rm -rf "$W"; mkdir -p "$W"
pass=0; fail=0
ok()   { echo "PASS $*"; pass=$((pass+1)); }
bad()  { echo "FAIL $*"; fail=$((fail+1)); }
wait_file() { for _ in $(seq 1200); do [ -e "$1" ] && return 0; sleep 0.1; done; return 1; }
gone() { ! [ -e /proc/$1 ] || grep -q ') Z ' /proc/$1/stat; }
# start MODE: runs a probe workload under the subreaper; sets P (its first PID) and D
start() {
  D=$W/$1; rm -rf "$D"; mkdir -p "$D"
  HERR=$D/err python3 "$B/reaper.py" python3 "$B/probe_restorability.py" "$1" "$D" &
  wait_file "$D/ready" || { echo "$1 did not start: $(tail -5 "$D/err")"; return 1; }
  P=$(cut -d' ' -f1 "$D/ready")
}
check_data() { # TAG: asks the workload to recheck its data
  local k; k=$(ls "$D" | grep -c '^result[0-9]*$' || true); k=$((k+1))
  touch "$D/verify"
  if wait_file "$D/result$k" && grep -q same=True "$D/result$k"; then ok "$1: $(cat "$D/result$k")"; else bad "$1: $(cat "$D/result$k" 2>/dev/null)"; fi
}
restores() { # MODE [checkpoint flags] [-- restore flags]
  local mode=$1; shift; local cf=() rf=() in_r=0
  for a in "$@"; do if [ "$a" = -- ]; then in_r=1; elif [ $in_r = 1 ]; then rf+=("$a"); else cf+=("$a"); fi; done
  echo "== $mode: expected restored (${cf[*]} -- ${rf[*]})"
  start "$mode" || { bad "$mode start"; return; }
  if "$G" checkpoint "$P" -D "$D/img" "${cf[@]}"; then
    sleep 0.5; gone "$P" || bad "$mode original still alive"
    if "$G" restore -D "$D/img" "${rf[@]}"; then check_data "$mode restored"; else bad "$mode restore"; fi
  else bad "$mode checkpoint"; fi
  pkill -9 -f "probe_restorability.py $mode"; sleep 1
}
refused() { # MODE CHECK
  echo "== $1: expected refused by $2"
  start "$1" || { bad "$1 start"; return; }
  "$G" checkpoint "$P" --dry-run; echo "dry-run exit $?"
  out=$("$G" checkpoint "$P" -D "$D/img" 2>&1); code=$?
  echo "$out"
  if [ $code != 0 ] && [[ "$out" == *"check $2"* ]] && ! [ -e "$D/img" ]; then ok "$1 refused: exit $code"; else bad "$1 not refused as expected (exit $code)"; fi
  check_data "$1 untouched and answering"
  pkill -9 -f "probe_restorability.py $1"; sleep 1
}
echo "== host"; nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader; "$G" --version
two=$([ "$(nvidia-smi -L | wc -l)" -ge 2 ] && echo yes)
restores one
restores indep
if [ "$two" ]; then
  refused host2 multi-gpu-process
  restores host2 --skip-check multi-gpu-process -- --gpu-map 0=1,1=0
  refused peer2 multi-gpu-process
fi
refused ipc cuda-ipc
refused ipc-cumem cuda-ipc
if [ "$two" ]; then
echo "== torchrun, NCCL defaults: expected refused by nccl-transports"
D=$W/ddp; mkdir -p "$D"
HERR=$D/err python3 "$B/reaper.py" torchrun --nproc-per-node 2 --master-port 29531 "$B/ddp_train.py" "$D" 1000000 1 &
if wait_file "$D/paused.0"; then
  TP=$(pgrep -f "torchrun --nproc-per-node 2 --master-port 29531" | head -1)
  out=$("$G" checkpoint "$TP" --dry-run 2>&1); echo "$out"
  "$G" checkpoint "$TP" -D "$D/img"; code=$?
  if [ $code != 0 ] && [[ "$out" == *"nccl-transports: process"* ]] && ! [ -e "$D/img" ]; then ok "torchrun refused, nccl-transports among the findings"; else bad "torchrun not refused for nccl-transports (exit $code)"; fi
else bad "torchrun did not start: $(tail -5 "$D/err")"; fi
pkill -9 -f ddp_train.py; pkill -9 -f "master-port 29531"; sleep 1
fi
# JAX opens a CUDA context on every GPU it sees: on a host with several, the process is on
# all of them (refused by multi-gpu-process); pinned to one GPU, it restores.
jax() { # TAG [ENV...]
  D=$W/jax-$1; mkdir -p "$D"
  env HERR="$D/err" XLA_PYTHON_CLIENT_PREALLOCATE=false "${@:2}" python3 "$B/reaper.py" python3 "$B/jax_holder.py" "$D" &
  wait_file "$D/ready" || { bad "JAX $1 did not start: $(tail -5 "$D/err")"; return 1; }
  P=$(cat "$D/ready")
}
echo "== JAX, all GPUs visible: expected refused by multi-gpu-process on several GPUs"
if [ "$two" ] && jax all; then
  out=$("$G" checkpoint "$P" -D "$D/img" 2>&1); code=$?; echo "$out"
  if [ $code != 0 ] && [[ "$out" == *"check multi-gpu-process"* ]]; then ok "JAX on all GPUs refused"; else bad "JAX on all GPUs (exit $code)"; fi
  check_data "JAX untouched"
fi
pkill -9 -f jax_holder.py; sleep 1
echo "== JAX, CUDA_VISIBLE_DEVICES=0: expected restored"
if jax one CUDA_VISIBLE_DEVICES=0; then
  if "$G" checkpoint "$P" -D "$D/img" && sleep 0.5 && "$G" restore -D "$D/img"; then check_data "JAX restored"; else bad "JAX checkpoint/restore"; fi
fi
pkill -9 -f jax_holder.py; sleep 1
echo "== forked and spawned children (plan.sh 8 9)"
bash "$B/plan.sh" 8 9 2>&1 | grep -E "^(PASS|FAIL|==)" | sed 's/^/  /'
echo "RESULT: $pass passed, $fail failed"
