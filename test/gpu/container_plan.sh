#!/usr/bin/env bash
# Container plan for the GPU machine, from the bundle directory as root (needs runc):
#  A. a runc container running holder.py on the GPU, checkpointed with
#     `gpucr checkpoint --container`, killed, restored under a new ID: data identical.
#  B. the same through plain `runc checkpoint` / `runc restore` with the runc integration
#     (gpucr install-runc-integration, pointed at by the container's org.criu.config).
# The container's root is the host's / read-only (python, torch and the CUDA libraries as
# installed), with the NVIDIA device nodes bound in and a writable exchange directory.
set -uo pipefail
cd "$(dirname "$0")"
B=$PWD; G="$B/gpucr"; CRIU=$B/criu/criu; export GPUCR_CRIU=$CRIU
W=/dev/shm/gpucr-ctr; rm -rf "$W"; mkdir -p "$W"
pass=0; fail=0
ok()  { echo "PASS $*"; pass=$((pass+1)); }
bad() { echo "FAIL $*"; fail=$((fail+1)); }
wait_for() { for _ in $(seq 1200); do [ -e "$1" ] && return 0; sleep 0.1; done; return 1; }

# bundle DIR [CRIU_CONFIG]: an OCI bundle running holder.py 1 GiB with DIR as /x.
bundle() {
  mkdir -p "$1/x"; runc spec --bundle "$1"
  python3 - "$1" "$B" "${2:-}" <<'PY'
import glob, json, os, sys
b, src, conf = sys.argv[1], sys.argv[2], sys.argv[3]
c = json.load(open(f"{b}/config.json"))
c["root"] = {"path": "/", "readonly": True}
c["process"].update(terminal=False, cwd="/x", args=["python3", f"{src}/holder.py", "1", "/x"])
c["process"]["env"] += ["HOME=/x"]
c["linux"]["namespaces"] = [n for n in c["linux"]["namespaces"] if n["type"] != "network"]
c["linux"]["resources"]["devices"] = [{"allow": True, "access": "rwm"}]
c["linux"].pop("maskedPaths", None)
c["mounts"] += [{"destination": "/x", "source": f"{b}/x", "type": "bind", "options": ["rbind", "rw"]},
                {"destination": src, "source": src, "type": "bind", "options": ["rbind", "ro"]}]
for d in sorted(glob.glob("/dev/nvidia*")):
    if not os.path.isdir(d):
        c["mounts"].append({"destination": d, "source": d, "type": "bind", "options": ["bind", "rw"]})
if conf:
    c["annotations"] = {"org.criu.config": conf}
json.dump(c, open(f"{b}/config.json", "w"), indent=1)
PY
}

# check NAME DIR: asks holder.py to re-check its GPU data and expects it unchanged.
check() {
  touch "$2/x/verify"
  if wait_for "$2/x/result1" && grep -q "same=True" "$2/x/result1"; then ok "$1: $(cat "$2/x/result1")"
  else bad "$1: $(cat "$2/x/result1" 2>/dev/null || echo no result)"; fi
}

PARTS=" ${*:-A B} "
if [[ "$PARTS" == *" A "* ]]; then
  echo "== A. gpucr checkpoint/restore --container"
  D=$W/a; bundle "$D"
  runc run -d --bundle "$D" gpucr-a </dev/null >/dev/null 2>&1
  if wait_for "$D/x/ready"; then
    "$G" checkpoint --container gpucr-a -D "$W/img-a" && "$G" inspect "$W/img-a" | head -12
    if runc state gpucr-a >/dev/null 2>&1; then bad "A. container still there after the checkpoint"; fi
    "$G" restore --container gpucr-a -D "$W/img-a" --new-id gpucr-a2 && check "A. restored through gpucr" "$D"
  else bad "A. holder did not start in the container"; fi
  runc delete -f gpucr-a >/dev/null 2>&1; runc delete -f gpucr-a2 >/dev/null 2>&1
fi
if [[ "$PARTS" == *" B "* ]]; then
  echo "== B. plain runc with the runc integration"
  D=$W/b; "$G" install-runc-integration --config "$W/runc.conf" --script "$W/criu-action" --log "$W/action.log"
  bundle "$D" "$W/runc.conf"
  runc run -d --bundle "$D" gpucr-b </dev/null >/dev/null 2>&1
  if wait_for "$D/x/ready"; then
    runc --criu "$CRIU" checkpoint --image-path "$W/img-b" --work-path "$W/work-b" gpucr-b </dev/null >/dev/null 2>&1 &&
      grep -q "GPU state checkpointed" "$W/action.log" && ok "B. runc checkpoint locked and checkpointed the GPU"
    runc --criu "$CRIU" restore -d --image-path "$W/img-b" --work-path "$W/work-b2" --bundle "$D" gpucr-b2 </dev/null >/dev/null 2>&1 &&
      check "B. restored through plain runc" "$D"
    grep -q "GPU state restored" "$W/action.log" || bad "B. post-resume did not restore the GPU state"
    cat "$W/action.log"
  else bad "B. holder did not start in the container"; fi
  runc delete -f gpucr-b >/dev/null 2>&1; runc delete -f gpucr-b2 >/dev/null 2>&1
fi
echo "container plan: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
