#!/usr/bin/env bash
# Where gpucr's wall time goes outside its phases, on the GPU machine from the bundle
# directory as root: bash profile_plan.sh [GIB] (16). A GIB holder is checkpointed to
# /dev/shm and restored with -v (every log line stamped with the seconds since the command
# began) and --cpu-profile (into $OUT, read with `go tool pprof bundle/gpucr FILE`); the
# holder's data is checked after the restore.
set -uo pipefail
cd "$(dirname "$0")"
B=$PWD; G="$B/gpucr"; export GPUCR_CRIU=$B/criu/criu
OUTD=${OUT:-/tmp/gpucr-out}; mkdir -p "$OUTD"
GIB=${1:-16}; W=/dev/shm/gpucr-profile; rm -rf "$W"; mkdir -p "$W/h"
wait_file() { for _ in $(seq 1200); do [ -e "$1" ] && return 0; sleep 0.1; done; return 1; }
# stamped NAME CMD...: runs CMD, its stderr lines prefixed with seconds since it began.
stamped() {
  local name=$1; shift
  python3 - "$@" > "$OUTD/$name.json" 2> "$OUTD/$name.log" <<'EOF_PY'
import subprocess, sys, time
t0 = time.monotonic()
p = subprocess.Popen(sys.argv[1:], stderr=subprocess.PIPE, text=True)
for line in p.stderr:
    sys.stderr.write("%7.3f %s" % (time.monotonic() - t0, line))
rc = p.wait()
sys.stderr.write("%7.3f exit %d\n" % (time.monotonic() - t0, rc))
sys.exit(rc)
EOF_PY
}
HERR=$W/h/err python3 "$B/reaper.py" python3 "$B/holder.py" "$GIB" "$W/h" & rp=$!
wait_file "$W/h/ready" || { echo "holder did not start: $(cat "$W/h/err")"; exit 1; }
HP=$(cut -d' ' -f1 "$W/h/ready")
stamped checkpoint "$G" -v --cpu-profile "$OUTD/checkpoint.pprof" checkpoint "$HP" -D "$W/img" --json || echo "FAIL checkpoint"
sleep 0.5
stamped restore "$G" -v --cpu-profile "$OUTD/restore.pprof" restore -D "$W/img" --json || echo "FAIL restore"
touch "$W/h/verify"; wait_file "$W/h/result1" && echo "restored: $(cat "$W/h/result1")"
for f in checkpoint restore; do
  echo "== $f"; cut -c1-220 "$OUTD/$f.log"
  python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print("total %.2f s:" % j["totalSeconds"], " ".join("%s %.2f" % (p["name"], p["seconds"]) for p in j["phases"]))' "$OUTD/$f.json"
done
kill -9 "$HP" 2>/dev/null; sleep 0.3; kill "$rp"; rm -rf "$W"
