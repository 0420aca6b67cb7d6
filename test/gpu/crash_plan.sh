#!/usr/bin/env bash
# The crash plan, run on the device machine from the bundle directory as root:
#   bash crash_plan.sh                       (GROUP_KILLS="5.2 5.5": also kill gpucr's process group then)
# gpucr is killed with SIGKILL 1.5 s and 5 s into the checkpoint of a 16 GiB holder and 1 s
# into its restore, and nothing else is done by hand: the guardian must roll back (or finish)
# so that the holder answers its data check, data identical, within 10 s of the kill, with
# the journal empty, THP as before and no staging left.
set -uo pipefail
cd "$(dirname "$0")"
B=$PWD
export GPUCR_CRIU=$B/criu/criu
G="$B/gpucr"
W=/dev/shm/gpucr-crash; rm -rf "$W"; mkdir -p "$W"
pass=0; fail=0
ok()  { echo "PASS $*"; pass=$((pass+1)); }
bad() { echo "FAIL $*"; fail=$((fail+1)); }
wait_file() { for _ in $(seq "${2:-1200}"); do [ -e "$1" ] && return 0; sleep 0.1; done; return 1; }
alive() { [ -e /proc/$1 ] && ! grep -q ') Z ' /proc/$1/stat; }
now() { date +%s.%N; }
THP=/sys/kernel/mm/transparent_hugepage/enabled
thp0=$(cat $THP)

# The holder runs under a subreaper: this machine's PID 1 reaps orphans slowly.
holder() {
  HD=$W/$1; rm -rf "$HD"; mkdir -p "$HD"
  HERR=$HD/err python3 "$B/reaper.py" python3 "$B/holder.py" 16 "$HD" & RP=$!
  wait_file "$HD/ready" || { echo "holder did not start: $(cat "$HD/err")"; return 1; }
  HP=$(cut -d' ' -f1 "$HD/ready")
}
# answer: asks the holder to recheck its data; prints the result and the seconds since $T0
answer() {
  local k; k=$(ls "$HD" | grep -c '^result' || true); k=$((k+1))
  touch "$HD/verify"
  if wait_file "$HD/result$k" 600; then echo "$(cat "$HD/result$k") answered $(python3 -c "print(round($(now) - $T0, 2))")s after the kill"
  else echo "no answer in 60 s"; fi
}
# clean IMG: the journal is empty, THP is as before, nothing is staged beside IMG
clean() {
  for _ in $(seq 300); do [ -z "$(ls -A /run/gpucr/txn 2>/dev/null)" ] && break; sleep 0.1; done
  local left; left="$(ls -A /run/gpucr/txn 2>/dev/null) $(ls -a "$(dirname "$1")" | grep partial)"
  [ -z "${left// /}" ] && [ "$(cat $THP)" = "$thp0" ] && echo "clean: journal empty, THP '$thp0', no staging" ||
    { echo "left: '$left', THP '$(cat $THP)'"; return 1; }
}

echo "== host"; nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
uname -r; "$G" --version

# kill_checkpoint AT [group]: kill -9 gpucr AT seconds into the checkpoint of a 16 GiB
# holder; with "group", gpucr leads its own process group and the whole group is killed, as
# timeout -s KILL does.
kill_checkpoint() {
  local at=$1 how=gpucr; [ "${2:-}" = group ] && how="gpucr's process group"
  echo "== kill -9 of $how ${at}s into the checkpoint of a 16 GiB holder"
  holder "k$at" || { bad "holder"; return; }
  if [ "${2:-}" = group ]; then setsid "$G" checkpoint "$HP" -D "$W/img$at" & gp=$!
  else "$G" checkpoint "$HP" -D "$W/img$at" & gp=$!; fi
  sleep "$at"
  if ! kill -0 $gp 2>/dev/null; then
    # Finished before the kill: nothing to roll back, and the holder was checkpointed away.
    echo "SKIP gpucr finished in under ${at}s: nothing was killed"
    "$G" verify "$W/img$at" || bad "the checkpoint that finished does not verify"
    wait $gp; kill $RP; rm -rf "$W/img$at"; return
  fi
  if [ "${2:-}" = group ]; then kill -9 -- "-$gp"; else kill -9 $gp; fi; T0=$(now); wait $gp 2>/dev/null
  echo "state right after the kill: $(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader | tr '\n' ' ')"
  r=$(answer); echo "$r"
  case "$r" in *same=True*kernel=True*) ok "checkpoint killed at ${at}s: holder answers, data identical";; *) bad "checkpoint killed at ${at}s: $r";; esac
  s=$(echo "$r" | sed -n 's/.*answered \([0-9.]*\)s.*/\1/p')
  [ -n "$s" ] && python3 -c "import sys; sys.exit(not $s < 10)" && ok "answered within 10 s ($s s)" || bad "answer took ${s:-forever}"
  clean "$W/img$at" && ok "nothing left" || bad "litter"
  [ -e "$W/img$at" ] && "$G" verify "$W/img$at" && echo "(the checkpoint had committed before the kill)"
  tail -6 /run/gpucr/recovery.log
  kill -9 "$HP"; sleep 0.3; kill $RP; rm -rf "$W/img$at"
}
for at in ${CHECKPOINT_KILLS:-1.5 5}; do kill_checkpoint "$at"; done
for at in ${GROUP_KILLS:-}; do kill_checkpoint "$at" group; done

echo "== kill -9 of gpucr 1s into the restore of a 16 GiB holder"
if holder r; then
  "$G" checkpoint "$HP" -D "$W/imgr" | head -1 || bad "checkpoint for the restore test"
  for _ in $(seq 100); do alive "$HP" || break; sleep 0.1; done
  "$G" restore -D "$W/imgr" & gp=$!
  sleep 1; kill -9 $gp; T0=$(now); wait $gp 2>/dev/null
  clean "$W/imgr" && ok "restore killed: nothing left" || bad "restore killed: litter"
  tail -3 /run/gpucr/recovery.log
  if alive "$HP"; then
    echo "the guardian finished the restore"
  else
    echo "the guardian rolled the restore back (no task left); restoring again"
    "$G" restore -D "$W/imgr" | head -1 || bad "second restore"
  fi
  r=$(answer); echo "$r"
  case "$r" in *same=True*kernel=True*) ok "restore killed at 1s: holder whole, data identical";; *) bad "restore killed: $r";; esac
  kill -9 "$HP"; sleep 0.3; kill $RP
fi
"$G" check | tail -4
echo "== $pass passed, $fail failed"
[ $fail -eq 0 ]
