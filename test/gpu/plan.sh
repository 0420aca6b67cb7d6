#!/usr/bin/env bash
# The GPU test plan, run on the device machine from the bundle directory as root:
#   bash plan.sh [TEST...]   (default: 1 2 3 4 5, one GPU; test 6 needs two GPUs; 7 streams;
#   8, 9: a GPU process with a forked, a spawned child; 10: an image others could change;
#   11: signed images, restored under --trust from a directory and streamed from a store;
#   12: a restore onto a GPU too busy to take the job; 13: training fed by DataLoader workers
#   forked after CUDA started; 14: a GPU process whose child opened an NVIDIA device itself;
#   15: 13's training checkpointed --leave-running, as a periodic checkpoint is; 16: 13's
#   training with workers started by spawn, their queues' semaphores carried in the image)
# Prints PASS/FAIL per test and writes JSON outputs to $OUT when set.
set -uo pipefail
cd "$(dirname "$0")"
B=$PWD
export GPUCR_CRIU=$B/criu/criu
G="$B/gpucr"
OUTD=${OUT:-/tmp/gpucr-out}; mkdir -p "$OUTD"
W=/dev/shm/gpucr-plan; rm -rf "$W"; mkdir -p "$W"
pass=0; fail=0
TESTS=" ${*:-1 2 3 4 5} "
has() { [[ "$TESTS" == *" $1 "* ]]; }
ok()   { echo "PASS $*"; pass=$((pass+1)); }
bad()  { echo "FAIL $*"; fail=$((fail+1)); }
wait_file() { for _ in $(seq 1200); do [ -e "$1" ] && return 0; sleep 0.1; done; return 1; }
gone() { ! [ -e /proc/$1 ] || grep -q ') Z ' /proc/$1/stat; }

# holder GIB TAG: starts a holder, sets HP (pid) and HD (its dir)
holder() {
  HD=$W/$2; rm -rf "$HD"; mkdir -p "$HD"
  setsid python3 "$B/holder.py" "$1" "$HD" "${@:3}" </dev/null >/dev/null 2>"$HD/err" &
  wait_file "$HD/ready" || { echo "holder $2 did not start: $(cat "$HD/err")"; return 1; }
  HP=$(cut -d' ' -f1 "$HD/ready")
}
# verify_holder PID DIR: asks the holder to recheck its data; prints the result line
verify_holder() {
  local k; k=$(ls "$2" | grep -c '^result' || true); k=$((k+1))
  touch "$2/verify"; wait_file "$2/result$k" && cat "$2/result$k"
}

echo "== host"; nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.total --format=csv,noheader
uname -r; "$G" --version; "$G" check; "$G" check --json > "$OUTD/check.json"

if has 1; then
for GIB in 1 16; do
  echo "== 1. holder ${GIB} GiB: checkpoint, kill, restore"
  holder "$GIB" h$GIB || { bad "1.$GIB start"; continue; }
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader
  "$G" checkpoint "$HP" -D "$W/img$GIB" --json > "$OUTD/ckpt$GIB.json" || { bad "1.$GIB checkpoint"; continue; }
  cat "$OUTD/ckpt$GIB.json"; sleep 0.5
  gone "$HP" && echo "original $HP is gone" || bad "1.$GIB original still alive"
  "$G" inspect "$W/img$GIB" | head -30
  "$G" restore -D "$W/img$GIB" --json > "$OUTD/rst$GIB.json" || { bad "1.$GIB restore"; continue; }
  cat "$OUTD/rst$GIB.json"
  r=$(verify_holder "$HP" "$HD"); echo "$r"
  case "$r" in *same=True*kernel=True*) ok "1.$GIB data identical after restore";; *) bad "1.$GIB data: $r";; esac
  kill -9 "$HP"; rm -rf "$W/img$GIB"
done
fi

if has 2; then
echo "== 2. deterministic training: checkpoint at step 10 of 30, restore, losses bit-identical"
mkdir -p "$W/ref" "$W/tr"
python3 "$B/train.py" "$W/ref" 30 >/dev/null 2>"$W/ref/err" || bad "2 reference run: $(tail -3 "$W/ref/err")"
setsid python3 "$B/train.py" "$W/tr" 30 10 </dev/null >/dev/null 2>"$W/tr/err" &
if wait_file "$W/tr/paused"; then
  TP=$(cat "$W/tr/paused")
  "$G" checkpoint "$TP" -D "$W/imgtr" && sleep 0.5 && gone "$TP" && "$G" restore -D "$W/imgtr" && touch "$W/tr/go" &&
    wait_file "$W/tr/done" && { if cmp "$W/ref/losses" "$W/tr/losses"; then ok "2 losses of steps 11-30 bit-identical"; else bad "2 losses differ"; diff "$W/ref/losses" "$W/tr/losses" | head; fi; } ||
    bad "2 checkpoint/restore of training"
else bad "2 training did not reach step 10: $(tail -3 "$W/tr/err")"; fi
fi

if has 3; then
echo "== 3. leave-running"
holder 1 lr || bad "3 start"
"$G" checkpoint "$HP" -D "$W/imglr" --leave-running && ! gone "$HP" && r=$(verify_holder "$HP" "$HD") &&
  case "$r" in *same=True*kernel=True*) ok "3 workload runs on correct after --leave-running: $r";; *) bad "3 $r";; esac || bad "3 leave-running"
kill -9 "$HP"; sleep 0.5
rm -f "$HD"/result*  # the original answered verifies after the checkpoint; the restored one has not
"$G" restore -D "$W/imglr" >/dev/null && r=$(verify_holder "$HP" "$HD") &&
  case "$r" in *same=True*) ok "3 leave-running image restores after kill";; *) bad "3 restore $r";; esac || bad "3 restore"
kill -9 "$HP"
fi

if has 4; then
echo "== 4. CRIU fails after the GPU was locked: the workload keeps running"
python3 -c 'import socket,time; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("127.0.0.1",47011)); s.listen(); c=s.accept(); time.sleep(600)' &
LP=$!; sleep 0.5
holder 1 tcp --connect 47011 || bad "4 start"
out=$("$G" checkpoint "$HP" -D "$W/imgtcp" 2>&1); rc=$?
echo "$out"
[ $rc -ne 0 ] && ! [ -e "$W/imgtcp" ] && ! gone "$HP" && r=$(verify_holder "$HP" "$HD") &&
  case "$r" in *same=True*kernel=True*) ok "4 refused (rc $rc), no image, workload correct: $r";; *) bad "4 $r";; esac || bad "4 rollback"
nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader
kill -9 "$HP" "$LP"
fi

if has 5; then
echo "== 5. a failing compatibility check is refused, and passes with its skip switch"
holder 1 cc || bad "5 start"
"$G" checkpoint "$HP" -D "$W/imgcc" >/dev/null
# Pretend the image came from a compute capability 8.0 GPU; the edit is sealed again, as
# gpucr refuses a manifest that does not match manifest.sha256.
python3 - "$W/imgcc/manifest.json" <<'PY'
import hashlib, json, os, sys
p = sys.argv[1]; m = json.load(open(p))
for s in m["gpus"]:
    for d in s["devices"]: d["properties"]["computeCapability"] = "8.0"
b = json.dumps(m).encode()
open(p, "wb").write(b)
open(os.path.join(os.path.dirname(p), "manifest.sha256"), "w").write(hashlib.sha256(b).hexdigest() + "\n")
PY
out=$("$G" restore -D "$W/imgcc" 2>&1); rc=$?; echo "$out"
[ $rc -ne 0 ] && echo "$out" | grep -q "skip-check compute-capability" && gone "$HP" && ok "5 refused with the check named" || bad "5 not refused"
NV_COMPUTE_CAP_CHECK=0 "$G" restore -D "$W/imgcc" --json && r=$(verify_holder "$HP" "$HD") &&
  case "$r" in *same=True*) ok "5 restores with NV_COMPUTE_CAP_CHECK=0: $r";; *) bad "5 $r";; esac || bad "5 skip"
kill -9 "$HP"
fi

if has 6; then
echo "== 6. checkpoint on GPU 0, restore onto GPU 1 with --gpu-map"
holder 2 mg || bad "6 start"
nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv,noheader
"$G" checkpoint "$HP" -D "$W/imgmg" >/dev/null || bad "6 checkpoint"
"$G" restore -D "$W/imgmg" --gpu-map 0=1 || bad "6 restore"
r=$(verify_holder "$HP" "$HD"); echo "$r"
on=$(nvidia-smi --query-compute-apps=pid,gpu_uuid --format=csv,noheader | grep "^$HP," | cut -d, -f2 | tr -d ' ')
g1=$(nvidia-smi --query-gpu=uuid --format=csv,noheader -i 1)
case "$r" in *same=True*kernel=True*) [ "$on" = "$g1" ] && ok "6 data identical, running on GPU 1 ($on)" || bad "6 runs on $on, not $g1";; *) bad "6 $r";; esac
kill -9 "$HP"
fi
if has 7; then
for GIB in 4 16; do
  echo "== 7. holder ${GIB} GiB streamed: checkpoint --to a store without -D, kill, restore --from (streamed)"
  holder "$GIB" s$GIB || { bad "7.$GIB start"; continue; }
  ST=$W/store-$GIB; mkdir -p "$ST"
  "$G" checkpoint "$HP" --to "$ST/ckpt" --json > "$OUTD/stream$GIB.json" || { bad "7.$GIB streamed checkpoint"; continue; }
  cat "$OUTD/stream$GIB.json"; sleep 0.5
  gone "$HP" || bad "7.$GIB original still alive"
  echo "local files left by the stream: $(ls /tmp | grep -c gpucr-stream || true)"
  "$G" restore --from "$ST/ckpt" --json > "$OUTD/streamrst$GIB.json" || { bad "7.$GIB restore --from"; continue; }
  cat "$OUTD/streamrst$GIB.json"
  r=$(verify_holder "$HP" "$HD"); echo "$r"
  case "$r" in *same=True*kernel=True*) ok "7.$GIB data identical after a streamed checkpoint";; *) bad "7.$GIB data: $r";; esac
  kill -9 "$HP"; rm -rf "$ST"
done
fi
# with_child N FLAG: a 16 GiB holder with a child (holder.py FLAG), checkpointed, killed and
# restored: with --fork (test 8, a DataLoader worker's default: the child holds the parent's
# NVIDIA device files without CUDA state, carried by gpucr's CRIU plugin) and with --spawn
# (test 9) both must checkpoint and restore, gpucr saving the parent's staged memory itself.
phases() { python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print(sys.argv[2], round(j["totalSeconds"],2), "s:", " ".join("%s %.2f" % (p["name"], p["seconds"]) for p in j["phases"]))' "$1" "$2"; }
# The holder runs under a subreaper that reaps whatever is orphaned below it: CRIU kills the
# child with its parent, and this machine's PID 1 would leave it a zombie holding its PID.
with_child() {
  local n=$1 img=$W/img$1
  echo "== $n. holder 16 GiB with a child ($2): checkpoint, kill, restore"
  HD=$W/h$n; rm -rf "$HD"; mkdir -p "$HD"
  HERR=$HD/err python3 "$B/reaper.py" python3 "$B/holder.py" 16 "$HD" "$2" & local rp=$!
  wait_file "$HD/ready" && wait_file "$HD/child" || { bad "$n holder with a child did not start: $(cat "$HD/err" 2>/dev/null)"; kill "$rp"; return; }
  HP=$(cut -d' ' -f1 "$HD/ready")
  if "$G" checkpoint "$HP" -D "$img" --json > "$OUTD/ckpt$n.json" 2> "$W/err$n"; then
    phases "$OUTD/ckpt$n.json" checkpoint
    echo "gpucr saved $(du -sh "$img/mem" 2>/dev/null | cut -f1); CRIU's page files $(du -ch "$img"/criu/pages-* | tail -1 | cut -f1)"
    sleep 0.5; gone "$HP" || bad "$n original still alive"
    if "$G" restore -D "$img" --json > "$OUTD/rst$n.json"; then
      phases "$OUTD/rst$n.json" restore
      r=$(verify_holder "$HP" "$HD"); echo "$r"
      case "$r" in *same=True*kernel=True*) ok "$n data identical after restore";; *) bad "$n data: $r";; esac
      c=$(cut -d' ' -f2 "$HD/child"); sleep 1
      [ "$(cut -d' ' -f2 "$HD/child")" -gt "$c" ] && ok "$n the child runs on" || bad "$n the child is not running"
    else bad "$n restore"; fi
  else
    cat "$W/err$n"
    r=$(verify_holder "$HP" "$HD"); echo "$r"
    bad "$n checkpoint failed, workload: $r"
  fi
  kill -9 "$HP"; sleep 0.3; kill "$rp"; rm -rf "$img"
}
if has 8; then with_child 8 --fork; fi
if has 9; then with_child 9 --spawn; fi

if has 10; then
echo "== 10. an image others could change: CRIU's files copied to a private directory, the GPU restore from there"
holder 1 pin || bad "10 start"
"$G" checkpoint "$HP" -D "$W/imgpin" && sleep 0.5 && gone "$HP" && chmod 0777 "$W/imgpin/criu" &&
  "$G" restore -D "$W/imgpin" -v 2> "$W/pin.log" && r=$(verify_holder "$HP" "$HD") &&
  grep -q "copied to a private directory" "$W/pin.log" &&
  case "$r" in *same=True*kernel=True*) ok "10 restored from the private copy: $r";; *) bad "10 $r";; esac ||
  { bad "10 restore from a private copy"; grep -v DEBUG "$W/pin.log" | tail -5; }
kill -9 "$HP"
fi
if has 11; then
echo "== 11. signed images: checkpoint --sign, restore --trust (every byte's SHA-256 checked), in place and streamed"
"$G" keygen "$W/key" >/dev/null || bad "11 keygen"
holder 4 sig || bad "11 start"
"$G" checkpoint "$HP" -D "$W/imgsig" --sign "$W/key" --json > "$OUTD/ckpt-signed.json" && phases "$OUTD/ckpt-signed.json" checkpoint &&
  sleep 0.5 && gone "$HP" && "$G" restore -D "$W/imgsig" --trust "$W/key.pub" --json > "$OUTD/rst-signed.json" &&
  phases "$OUTD/rst-signed.json" restore && r=$(verify_holder "$HP" "$HD") &&
  case "$r" in *same=True*kernel=True*) ok "11 signed image restored under --trust: $r";; *) bad "11 $r";; esac || bad "11 signed image"
"$G" checkpoint "$HP" --to "$W/sigstore/ckpt" --sign "$W/key" --json > "$OUTD/stream-signed.json" &&
  sleep 0.5 && gone "$HP" && "$G" restore --from "$W/sigstore/ckpt" --trust "$W/key.pub" --json > "$OUTD/streamrst-signed.json" &&
  phases "$OUTD/streamrst-signed.json" restore && r=$(verify_holder "$HP" "$HD") &&
  case "$r" in *same=True*kernel=True*) ok "11 signed streamed image restored --from under --trust: $r";; *) bad "11 streamed $r";; esac || bad "11 signed streamed image"
kill -9 "$HP"; rm -rf "$W/imgsig" "$W/sigstore"
fi
if has 13; then
echo "== 13. training fed by 2 DataLoader workers (forked, pinned memory): checkpoint at step 10 of 30, restore, losses bit-identical"
mkdir -p "$W/dlref" "$W/dl"
python3 "$B/train.py" "$W/dlref" 30 -1 2 >/dev/null 2>"$W/dlref/err" || bad "13 reference run: $(tail -3 "$W/dlref/err")"
setsid python3 "$B/train.py" "$W/dl" 30 10 2 </dev/null >/dev/null 2>"$W/dl/err" &
if wait_file "$W/dl/paused"; then
  TP=$(cat "$W/dl/paused"); kids=$(pgrep -P "$TP" | tr '\n' ' ')
  fds() { for k in $kids; do printf '%s:%s ' "$k" "$(ls /proc/$k/fd 2>/dev/null | wc -l)"; done; }
  before=$(fds); echo "workers (pid:descriptors) before: $before"
  "$G" checkpoint "$TP" -D "$W/imgdl" --json > "$OUTD/ckpt13.json" && phases "$OUTD/ckpt13.json" checkpoint && sleep 0.5 && gone "$TP" &&
    "$G" restore -D "$W/imgdl" --json > "$OUTD/rst13.json" && phases "$OUTD/rst13.json" restore && {
      after=$(fds); echo "workers after restore: $after"
      [ "$before" = "$after" ] && ok "13 the workers restored with their descriptors, none more" || bad "13 workers before $before, after $after"
      grep -c nvidia "/proc/${kids%% *}/maps" | sed 's/^/nvidia mappings of the first worker after restore: /'
      touch "$W/dl/go"
      wait_file "$W/dl/done" && { if cmp "$W/dlref/losses" "$W/dl/losses"; then ok "13 losses of steps 11-30 bit-identical"; else bad "13 losses differ"; diff "$W/dlref/losses" "$W/dl/losses" | head; fi; }
    } || { bad "13 checkpoint/restore of training with DataLoader workers"; tail -3 "$W/dl/err"; }
else bad "13 training did not reach step 10: $(tail -3 "$W/dl/err")"; fi
fi
if has 14; then
echo "== 14. a GPU process with a child holding /dev/nvidiactl it opened itself: refused up front, the workload runs on"
mkdir -p "$W/nvml"
setsid python3 -c 'import subprocess, sys, time, torch
x = torch.ones(1 << 28, device="cuda"); torch.cuda.synchronize()
c = subprocess.Popen([sys.executable, "-c", "import os, time; f = os.open(\"/dev/nvidiactl\", os.O_RDWR); print(1, flush=True); time.sleep(600)"], stdout=subprocess.PIPE)
c.stdout.readline(); open(sys.argv[1] + "/ready", "w").write("ready")
while True:
    time.sleep(0.2); assert float(x.sum()) == float(1 << 28)' "$W/nvml" </dev/null >/dev/null 2>"$W/nvml/err" &
NP=$!
if wait_file "$W/nvml/ready"; then
  out=$("$G" checkpoint "$NP" -D "$W/imgnvml" 2>&1); rc=$?; echo "rc $rc: $out"
  [ $rc -ne 0 ] && echo "$out" | grep -q "opened by itself" && ! [ -e "$W/imgnvml" ] && sleep 1 && ! gone "$NP" &&
    ok "14 refused, the child named, no image, the workload runs on" || bad "14 rc $rc"
else bad "14 did not start: $(tail -3 "$W/nvml/err")"; fi
pkill -9 -P "$NP"; kill -9 "$NP"
fi
if has 15; then
echo "== 15. DataLoader training checkpointed --leave-running at step 10: runs on to 30, then the image restores and runs 11-30 again, losses bit-identical both times"
mkdir -p "$W/dlref2" "$W/dlp"
python3 "$B/train.py" "$W/dlref2" 30 -1 2 >/dev/null 2>&1 || bad "15 reference run"
setsid python3 "$B/train.py" "$W/dlp" 30 10 2 </dev/null >/dev/null 2>&1 &
JP=$!
if wait_file "$W/dlp/paused"; then
  TP=$(cat "$W/dlp/paused")
  if "$G" checkpoint "$TP" -D "$W/imgdlp" --leave-running --json > "$OUTD/ckpt15.json"; then
    phases "$OUTD/ckpt15.json" checkpoint
    python3 -c 'import json,sys; print("paused %.2f s of %.2f s" % (json.load(open(sys.argv[1]))["pausedSeconds"], json.load(open(sys.argv[1]))["totalSeconds"]))' "$OUTD/ckpt15.json"
    touch "$W/dlp/go"
    wait_file "$W/dlp/done" && cmp -s "$W/dlref2/losses" "$W/dlp/losses" && ok "15 the job left running: losses of steps 11-30 bit-identical" || bad "15 the job left running"
    wait "$JP" # reaped: a zombie holds its PID, which the restore needs
    rm -f "$W/dlp/done"
    if "$G" restore -D "$W/imgdlp" --json > "$OUTD/rst15.json"; then
      phases "$OUTD/rst15.json" restore
      wait_file "$W/dlp/done" && [ "$(tail -20 "$W/dlp/losses")" = "$(tail -20 "$W/dlref2/losses")" ] &&
        ok "15 the image restored: steps 11-30 again, losses bit-identical" || { bad "15 restored run's losses"; tail -3 "$W/dlp/losses"; }
    else bad "15 restore of the image left running"; fi
  else bad "15 checkpoint --leave-running"; fi
else bad "15 training did not reach step 10"; fi
fi
if has 16; then
echo "== 16. training fed by 2 DataLoader workers started by spawn: checkpoint at step 10 of 30, restore twice, losses bit-identical"
mkdir -p "$W/spref" "$W/sp"
python3 "$B/train.py" "$W/spref" 30 -1 2 spawn >/dev/null 2>&1 || bad "16 reference run"
setsid python3 "$B/train.py" "$W/sp" 30 10 2 spawn </dev/null >/dev/null 2>&1 &
JP=$!
if wait_file "$W/sp/paused"; then
  TP=$(cat "$W/sp/paused")
  if "$G" checkpoint "$TP" -D "$W/imgsp" --json > "$OUTD/ckpt16.json"; then
    phases "$OUTD/ckpt16.json" checkpoint
    python3 -c 'import json,sys; print("semaphores carried:", len(json.load(open(sys.argv[1])).get("linkedFiles") or []))' "$W/imgsp/manifest.json"
    wait "$JP"
    touch "$W/sp/go"
    for round in 1 2; do
      rm -f "$W/sp/done"; cp "$W/sp/losses" "$W/sp/losses.before"
      if "$G" restore -D "$W/imgsp" --json > "$OUTD/rst16-$round.json"; then
        phases "$OUTD/rst16-$round.json" restore
        wait_file "$W/sp/done" && [ "$(tail -20 "$W/sp/losses")" = "$(tail -20 "$W/spref/losses")" ] &&
          ok "16 restore $round: steps 11-30 bit-identical" || { bad "16 restore $round losses"; tail -3 "$W/sp/losses"; }
        for _ in $(seq 100); do [ -e "/proc/$TP" ] || break; sleep 0.1; done
      else bad "16 restore $round"; fi
    done
  else bad "16 checkpoint of spawn workers"; fi
else bad "16 training did not reach step 10"; fi
fi
if has 12; then
echo "== 12. a GPU too busy for the job: refused before anything is restored; the driver's own failure rolled back; restores once freed"
holder 8 busy || bad "12 start"
"$G" checkpoint "$HP" -D "$W/imgbusy" >/dev/null && sleep 0.5 && gone "$HP" || bad "12 checkpoint"
# hog takes all but 4 GiB of GPU 0 and holds it until its stdin closes.
coproc HOG { python3 -c 'import sys, torch
free, _ = torch.cuda.mem_get_info(0); x = torch.empty(free - (4 << 30), dtype=torch.uint8, device="cuda:0")
print(free >> 20, flush=True); sys.stdin.read()'; }
read -r hogfree <&"${HOG[0]}"; echo "hog took $((hogfree - 4096)) MiB of $hogfree MiB free"
nvidia-smi --query-gpu=index,memory.used,memory.free --format=csv,noheader -i 0
out=$("$G" restore -D "$W/imgbusy" 2>&1); rc=$?; echo "rc $rc: $out"
[ $rc -ne 0 ] && echo "$out" | grep -q "not enough free memory" && gone "$HP" && "$G" verify "$W/imgbusy" >/dev/null &&
  ok "12 refused up front, nothing restored, image intact" || bad "12 not refused up front"
out=$("$G" restore -D "$W/imgbusy" --skip-check memory 2>&1); rc=$?; echo "rc $rc: $out"
[ $rc -ne 0 ] && gone "$HP" && "$G" verify "$W/imgbusy" >/dev/null &&
  ok "12 the driver's failure rolled back, image intact" || bad "12 driver failure: rc $rc, pid $HP gone: $(gone "$HP" && echo yes || echo no)"
exec {HOG[1]}>&-; wait "$HOG_PID"
"$G" restore -D "$W/imgbusy" >/dev/null && r=$(verify_holder "$HP" "$HD") &&
  case "$r" in *same=True*kernel=True*) ok "12 restored once the GPU was freed: $r";; *) bad "12 $r";; esac || bad "12 restore once freed"
kill -9 "$HP" 2>/dev/null; rm -rf "$W/imgbusy"
fi
echo "== $pass passed, $fail failed"
[ $fail -eq 0 ]
