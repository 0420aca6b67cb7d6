#!/usr/bin/env bash
# Stopped and frozen GPU processes, on the GPU machine from the bundle directory as root:
#   bash stopped_plan.sh
# S1. What the driver does with a process that does not run: a 1 GiB holder is stopped
#     (SIGSTOP), then frozen with its cgroup (cgroup v2, as containerd pauses a container),
#     and cuCheckpointProcessLock is called on it with a 2 s timeout, itself given 20 s: it
#     returns (its result printed) or is still waiting. The holder then runs again and must
#     still verify, its GPU state running.
# S2. gpucr checkpoint of the stopped and of the frozen holder: refused in one line, at once,
#     nothing locked; the holder runs on and verifies.
set -uo pipefail
if [ -z "${PLAN_REAPER:-}" ]; then exec env PLAN_REAPER=1 python3 "$(dirname "$0")/subreaper.py" bash "$0" "$@"; fi
cd "$(dirname "$0")"
B=$PWD; G=$B/gpucr; export GPUCR_CRIU=$B/criu/criu
W=/dev/shm/gpucr-stopped; rm -rf "$W"; mkdir -p "$W"
pass=0; fail=0
ok()  { echo "PASS $*"; pass=$((pass+1)); }
bad() { echo "FAIL $*"; fail=$((fail+1)); }
wait_file() { for _ in $(seq 1200); do compgen -G "$1" >/dev/null && return 0; sleep 0.1; done; return 1; }

setsid python3 "$B/holder.py" 1 "$W" </dev/null >/dev/null 2>"$W/err" &
wait_file "$W/ready" || { echo "holder did not start: $(cat "$W/err")"; exit 1; }
HP=$(cut -d' ' -f1 "$W/ready"); echo "holder $HP"
verify() {
  rm -f "$W"/result*; touch "$W/verify"
  if wait_file "$W/result*" && grep -q "same=True" "$W"/result*; then ok "$1: $(cat "$W"/result*)"
  else bad "$1: $(cat "$W"/result* 2>/dev/null || echo no result)"; fi
}
# lock_probe: cuCheckpointProcessLock on the holder, 2 s timeout, in a process of its own
# that is given 20 s; then (if it locked) unlock. Prints what happened.
lock_probe() {
  timeout 20 python3 - "$HP" <<'PY'
import ctypes, sys, time
pid = int(sys.argv[1])
cuda = ctypes.CDLL("libcuda.so.1")
class Args(ctypes.Structure):
    _fields_ = [("timeoutMs", ctypes.c_uint), ("reserved0", ctypes.c_uint), ("reserved1", ctypes.c_ulonglong * 7)]
a = Args(); a.timeoutMs = 2000
t = time.time()
r = cuda.cuCheckpointProcessLock(pid, ctypes.byref(a))
print(f"cuCheckpointProcessLock returned {r} after {time.time() - t:.2f} s", flush=True)
if r == 0:
    print(f"cuCheckpointProcessUnlock returned {cuda.cuCheckpointProcessUnlock(pid, None)}", flush=True)
PY
  local rc=$?
  [ $rc -eq 124 ] && echo "cuCheckpointProcessLock still waiting after 20 s (killed)"
  return 0
}
# state: the driver's state of the holder (0 running, 1 locked); a lock the probe gave up on
# but the driver granted once the process ran again is released here.
state() { timeout 20 python3 -c "
import ctypes,sys; c=ctypes.CDLL('libcuda.so.1'); s=ctypes.c_int(-1); pid=int(sys.argv[1])
r=c.cuCheckpointProcessGetState(pid, ctypes.byref(s)); print(r, s.value, end='')
if r == 0 and s.value == 1: print(' (locked: unlock returned %d)' % c.cuCheckpointProcessUnlock(pid, None), end='')
print()" "$HP"; }

echo "== S1. the driver and a stopped process"
kill -STOP "$HP"; sleep 0.5; grep State /proc/"$HP"/status
lock_probe; kill -CONT "$HP"; sleep 1; echo "after SIGCONT: driver state $(state)"
verify "S1. stopped, then running again"

echo "== S1. the driver and a process frozen with its cgroup (v2)"
CG=""
for top in /sys/fs/cgroup /sys/fs/cgroup/unified; do
  [ -e "$top/cgroup.subtree_control" ] && { CG=$top/gpucr-stopped-plan; break; }
done
if [ -n "$CG" ] && mkdir -p "$CG" && echo "$HP" > "$CG/cgroup.procs"; then
  echo 1 > "$CG/cgroup.freeze"; sleep 0.5; cat "$CG/cgroup.events"
  lock_probe; echo 0 > "$CG/cgroup.freeze"; sleep 1; echo "after the thaw: driver state $(state)"
  verify "S1. frozen, then thawed"
else bad "S1. no cgroup v2 to freeze the holder in"; fi

echo "== S2. gpucr checkpoint refuses both, at once"
for how in stopped frozen; do
  if [ $how = stopped ]; then kill -STOP "$HP"; else echo 1 > "$CG/cgroup.freeze"; fi
  sleep 0.5; t=$(date +%s.%N)
  out=$(timeout 60 "$G" checkpoint "$HP" -D "$W/img-$how" 2>&1); rc=$?
  took=$(awk -v a="$t" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
  echo "exit $rc after $took s: $out"
  if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$(echo "$out" | wc -l)" -eq 1 ] && [ ! -e "$W/img-$how" ]; then ok "S2. $how: refused"
  else bad "S2. $how: not refused in one line"; fi
  if [ $how = stopped ]; then kill -CONT "$HP"; else echo 0 > "$CG/cgroup.freeze"; fi
  sleep 0.5; echo "driver state $(state)"; verify "S2. $how, then running again"
done
kill -9 "$HP" 2>/dev/null; sleep 1
[ -n "$CG" ] && rmdir "$CG" 2>/dev/null
echo "stopped plan: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
