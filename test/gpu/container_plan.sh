#!/usr/bin/env bash
# Container plan for the GPU machine, from the bundle directory as root (needs runc: the
# bundle's, from scripts/bundle.sh, is put first on PATH when there is one):
#  A. a runc container running holder.py on the GPU, checkpointed with
#     `gpucr checkpoint --container`, killed, restored under a new ID: data identical.
#  B. the same through plain `runc checkpoint` / `runc restore` with the runc integration
#     (gpucr install-runc-integration, pointed at by the container's org.criu.config).
#  D. a holder container whose holder has a forked child (a DataLoader worker's way): the
#     child's NVIDIA device files carried by gpucr's CRIU plugin, which runc's CRIU loads.
#  C. a 16 GiB holder container through gpucr, with gpucr saving and filling the memory
#     and with CRIU moving all pages (checkpoint --criu-writes-pages, restore --criu-restores-pages):
#     data identical after both, times side by side.
# The container's rootfs is an empty directory with the host's system directories bound in
# read-only (python, torch and the CUDA libraries as installed), the NVIDIA device nodes,
# and a writable exchange directory /x. On a failure it prints what runc, CRIU and the
# action script logged.
set -uo pipefail
cd "$(dirname "$0")"
B=$PWD; G="$B/gpucr"; CRIU=$B/criu/criu; export GPUCR_CRIU=$CRIU
if [ -x "$B/runc/runc" ]; then
  export PATH="$B/runc:$PATH"
  # runc re-executes itself as `runc init` without the wrapper's LD_LIBRARY_PATH, so the
  # host itself must be able to load runc's libraries (libseccomp).
  if env -u LD_LIBRARY_PATH ldd "$B/runc/runc.bin" | grep -q "not found"; then
    echo "host lacks runc's libraries: installing the bundle's into /usr/local/lib"
    cp "$B"/runc/lib/* /usr/local/lib/ && ldconfig
  fi
fi
W=/dev/shm/gpucr-ctr; rm -rf "$W"; mkdir -p "$W"
pass=0; fail=0
ok()  { echo "PASS $*"; pass=$((pass+1)); }
bad() { echo "FAIL $*"; fail=$((fail+1)); }
wait_for() { for _ in $(seq 1200); do [ -e "$1" ] && return 0; sleep 0.1; done; return 1; }

echo "== host"; uname -r; command -v runc; runc --version | head -1; "$G" --version
echo "cgroup: $(stat -fc %T /sys/fs/cgroup) $(cat /proc/self/cgroup | tr '\n' ' ')"
ldconfig -p | grep -E 'libcuda\.so|libnvidia-ml' ; grep -E 'nvidia|cuda|opengl' /proc/self/mountinfo
# CUDA creates /dev/nvidia-uvm on first use, which a container (its /dev is its own) cannot.
[ -e /dev/nvidia-uvm ] || python3 -c 'import torch; torch.zeros(1, device="cuda")'
ls /dev/nvidia*

# bundle DIR [CRIU_CONFIG [GIB [FLAG]]]: an OCI bundle running holder.py GIB (1) with DIR/x
# as /x, and holder.py's FLAG (--fork: a forked child).
bundle() {
  mkdir -p "$1/x" "$1/rootfs"; runc spec --bundle "$1"
  python3 - "$1" "$B" "${2:-}" "${3:-1}" "${4:-}" <<'PY'
import json, sys
b, src, conf, gib, flag = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
sys.path.insert(0, src)
from hostroot import host_root
h = host_root(f"{b}/rootfs")
c = json.load(open(f"{b}/config.json"))
c["root"] = {"path": "rootfs", "readonly": False}
c["process"].update(terminal=False, cwd="/x", args=[h["python"], f"{src}/holder.py", gib, "/x"] + ([flag] if flag else []))
c["process"]["env"] += h["env"]
c["linux"]["namespaces"] = [n for n in c["linux"]["namespaces"] if n["type"] != "network"]
c["linux"]["resources"]["devices"] = [{"allow": True, "access": "rwm"}]
c["linux"].pop("maskedPaths", None)
for m in h["binds"]:
    c["mounts"].append({"destination": m, "source": m, "type": "bind", "options": ["bind", "ro"]})
c["mounts"] += [{"destination": "/x", "source": f"{b}/x", "type": "bind", "options": ["bind", "rw"]},
                {"destination": src, "source": src, "type": "bind", "options": ["bind", "ro"]}]
for d in h["devices"]:
    c["mounts"].append({"destination": d, "source": d, "type": "bind", "options": ["bind", "rw"]})
if conf:
    c["annotations"] = {"org.criu.config": conf}
json.dump(c, open(f"{b}/config.json", "w"), indent=1)
PY
}

# start NAME DIR: runs container NAME from bundle DIR; says why when holder.py does not start.
start() {
  runc --log "$W/run-$1.log" run -d --bundle "$2" "$1" </dev/null >/dev/null 2>&1
  for i in $(seq 1200); do
    [ -e "$2/x/ready" ] && return 0
    if ((i % 20 == 0)) && ! runc state "$1" 2>/dev/null | grep -q '"running"'; then break; fi
    sleep 0.1
  done
  echo "holder did not start in $1: runc state: $(runc state "$1" 2>&1 | tr -d '\n')"
  tail -5 "$W/run-$1.log"; runc delete -f "$1" >/dev/null 2>&1
  echo "-- the same container in the foreground, for its errors:"
  cp "$2/config.json" "$2/config.json.orig"
  python3 - "$2/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); a = c["process"]["args"]
diag = ("import ctypes, os, runpy, sys\n"
        "print('LD_LIBRARY_PATH', os.environ.get('LD_LIBRARY_PATH'), flush=True)\n"
        "try: ctypes.CDLL('libcuda.so.1'); print('libcuda.so.1 loads', flush=True)\n"
        "except OSError as e: print('libcuda.so.1:', e, flush=True)\n"
        "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')\n")
c["process"]["args"] = [a[0], "-c", diag, *a[1:]]
json.dump(c, open(sys.argv[1], "w"))
PY
  timeout 90 runc --debug run --bundle "$2" "$1-diag" </dev/null 2>&1 | grep -v 'level=debug' | tail -40
  runc delete -f "$1-diag" >/dev/null 2>&1; mv "$2/config.json.orig" "$2/config.json"
  return 1
}

# check NAME DIR: asks holder.py to re-check its GPU data and expects it unchanged.
check() {
  touch "$2/x/verify"
  if wait_for "$2/x/result1" && grep -q "same=True" "$2/x/result1"; then ok "$1: $(cat "$2/x/result1")"
  else bad "$1: $(cat "$2/x/result1" 2>/dev/null || echo no result)"; fi
}

# diagnose: what runc, CRIU and the action script logged, after a failure.
diagnose() {
  echo "== diagnostics"
  for f in "$W"/*.log "$W"/work-*/*.log /tmp/gpucr-restore-*/*.log; do
    [ -f "$f" ] && { echo "--- $f"; tail -40 "$f"; }
  done
  dmesg 2>/dev/null | tail -20
}

PARTS=" ${*:-A B C} "
if [[ "$PARTS" == *" A "* ]]; then
  echo "== A. gpucr checkpoint/restore --container"
  D=$W/a; bundle "$D"
  if start gpucr-a "$D"; then
    if "$G" checkpoint --container gpucr-a -D "$W/img-a"; then
      "$G" inspect "$W/img-a" | head -12
      if runc state gpucr-a >/dev/null 2>&1; then bad "A. container still there after the checkpoint"; fi
      if "$G" restore --container gpucr-a -D "$W/img-a" --new-id gpucr-a2; then check "A. restored through gpucr" "$D"
      else bad "A. gpucr restore --container"; fi
    else bad "A. gpucr checkpoint --container"; fi
  else bad "A. holder did not start in the container"; fi
  runc delete -f gpucr-a >/dev/null 2>&1; runc delete -f gpucr-a2 >/dev/null 2>&1
fi
if [[ "$PARTS" == *" D "* ]]; then
  echo "== D. a container whose holder has a forked child: checkpoint/restore --container"
  D=$W/d; bundle "$D" "" 1 --fork
  if start gpucr-d "$D" && wait_for "$D/x/child"; then
    if "$G" checkpoint --container gpucr-d -D "$W/img-d"; then
      ls "$W/img-d/criu" | grep -c gpucr-nvidia-file | sed 's/^/device files the plugin recorded: /'
      if "$G" restore --container gpucr-d -D "$W/img-d" --new-id gpucr-d2; then
        check "D. restored through gpucr, the child's device files carried" "$D"
        c=$(cut -d' ' -f2 "$D/x/child"); sleep 1
        [ "$(cut -d' ' -f2 "$D/x/child")" -gt "$c" ] && ok "D. the child runs on" || bad "D. the child is not running"
      else bad "D. gpucr restore --container"; diagnose; fi
    else bad "D. gpucr checkpoint --container"; diagnose; fi
  else bad "D. holder with a child did not start in the container"; fi
  runc delete -f gpucr-d >/dev/null 2>&1; runc delete -f gpucr-d2 >/dev/null 2>&1
fi
if [[ "$PARTS" == *" B "* ]]; then
  echo "== B. plain runc with the runc integration"
  D=$W/b; "$G" install-runc-integration --config "$W/runc.conf" --script "$W/criu-action" --log "$W/action.log"
  bundle "$D" "$W/runc.conf"
  if start gpucr-b "$D"; then
    if runc --log "$W/runc-b.log" --criu "$CRIU" checkpoint --image-path "$W/img-b" --work-path "$W/work-b" gpucr-b </dev/null >/dev/null 2>&1; then
      if grep -q "GPU state checkpointed" "$W/action.log"; then ok "B. runc checkpoint locked and checkpointed the GPU"
      else bad "B. runc checkpoint did not checkpoint the GPU"; fi
      "$G" inspect "$W/img-b" | head -12
      if runc --log "$W/runc-b2.log" --criu "$CRIU" restore -d --image-path "$W/img-b" --work-path "$W/work-b2" --bundle "$D" gpucr-b2 </dev/null >/dev/null 2>&1; then
        check "B. restored through plain runc" "$D"
        grep -q "GPU state restored" "$W/action.log" || bad "B. post-resume did not restore the GPU state"
      else bad "B. runc restore"; fi
    else bad "B. runc checkpoint"; fi
    cat "$W/action.log"
  else bad "B. holder did not start in the container"; fi
  runc delete -f gpucr-b >/dev/null 2>&1; runc delete -f gpucr-b2 >/dev/null 2>&1
fi
if [[ "$PARTS" == *" C "* ]]; then
  echo "== C. 16 GiB container: gpucr saving and filling memory, and CRIU moving all pages"
  for mode in gpucr criu-pages; do
    D=$W/c-$mode; bundle "$D" "" 16; ckf=(); rsf=()
    [ $mode = criu-pages ] && ckf=(--criu-writes-pages) rsf=(--criu-restores-pages)
    if start gpucr-c-$mode "$D"; then
      if "$G" checkpoint --json --container gpucr-c-$mode -D "$W/img-c-$mode" "${ckf[@]}" > "$W/ck-$mode.json"; then
        if "$G" restore --json --container gpucr-c-$mode -D "$W/img-c-$mode" --new-id gpucr-c2-$mode "${rsf[@]}" > "$W/rs-$mode.json"; then
          check "C. $mode restored" "$D"
          python3 - "$W/ck-$mode.json" "$W/rs-$mode.json" "$mode" <<'PY'
import json, sys
for path, what in zip(sys.argv[1:3], ("checkpoint", "restore")):
    j = json.load(open(path))
    print(f"C. {sys.argv[3]} {what} {j['totalSeconds']:.2f} s:", " ".join(f"{p['name']} {p['seconds']:.2f}" for p in j["phases"]))
PY
        else bad "C. $mode gpucr restore --container"; fi
      else bad "C. $mode gpucr checkpoint --container"; fi
    else bad "C. $mode holder did not start in the container"; fi
    runc delete -f gpucr-c-$mode >/dev/null 2>&1; runc delete -f gpucr-c2-$mode >/dev/null 2>&1
    rm -rf "$W/img-c-$mode"
  done
fi
[ "$fail" -eq 0 ] || diagnose
echo "container plan: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
