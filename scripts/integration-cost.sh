#!/usr/bin/env bash
# What the CRIU integration costs a container without GPU state: times REPS plain `runc
# checkpoint` / `runc restore` round trips of a busybox container, first with no action
# script, then with the integration of each gpucr binary given, and prints the median of each.
# Usage (root, runc, busybox-static, CRIU 4.1+):
#   scripts/integration-cost.sh [REPS] GPUCR...
# The host's /etc/criu is left alone: the container's org.criu.config annotation names a
# configuration file of this run's own.
set -euo pipefail

reps=${1:-5}
shift || true
criu=${GPUCR_CRIU:-/opt/gpucr/criu/sbin/criu}
[ -x "$criu" ] || criu=$(command -v criu)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# bundle DIR CONF: a busybox bundle in DIR running a shell loop in the host's network
# namespace, with CONF as its CRIU configuration.
bundle() {
  mkdir -p "$1/rootfs/bin"
  cp /bin/busybox "$1/rootfs/bin/busybox"
  ln -s busybox "$1/rootfs/bin/sh"
  ln -s busybox "$1/rootfs/bin/sleep"
  (cd "$1" && runc spec)
  python3 - "$1/config.json" "$2" <<'PY'
import json, sys
path, conf = sys.argv[1], sys.argv[2]
s = json.load(open(path))
s["process"]["terminal"] = False
s["process"]["args"] = ["sh", "-c", "i=0; while true; do i=$((i+1)); echo $i > /count; sleep 0.1; done"]
s["root"]["readonly"] = False
s["linux"]["namespaces"] = [n for n in s["linux"]["namespaces"] if n["type"] != "network"]
s["annotations"] = {"org.criu.config": conf}
json.dump(s, open(path, "w"))
PY
}

# seconds CMD...: wall time of CMD, in seconds.
seconds() {
  local t0 t1
  t0=$(date +%s.%N)
  "$@" >/dev/null 2>&1 </dev/null
  t1=$(date +%s.%N)
  awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.4f\n", b - a }'
}

median() { sort -n | awk '{a[NR]=$1} END {printf "%.3f", (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }

# One container per configuration, each round trip of the one after the other's, so that
# the host's load changes them alike.
labels=("no action script") confs=("$work/none.conf")
: > "$work/none.conf"
n=0
for g in "$@"; do
  n=$((n + 1))
  d=$work/int$n
  "$g" install-runc-integration --config "$d/runc.conf" --crun-config "" --script "$d/lib/criu-action" \
    --log "$d/action.log" >/dev/null 2>&1 ||
    "$g" install-runc-integration --config "$d/runc.conf" --script "$d/lib/criu-action" --log "$d/action.log" >/dev/null
  labels+=("integration of $g") confs+=("$d/runc.conf")
done
ids=()
for i in "${!confs[@]}"; do
  bundle "$work/b$i" "${confs[$i]}"
  ids+=("gpucr-cost-$$-$i")
  runc run -d --bundle "$work/b$i" "${ids[$i]}" >/dev/null 2>&1 </dev/null
done
trap 'for id in "${ids[@]}"; do runc delete -f "$id" >/dev/null 2>&1 || true; done; rm -rf "$work"' EXIT
sleep 0.5
for r in $(seq "$reps"); do
  for i in "${!confs[@]}"; do
    rm -rf "$work/img$i" "$work/w$i"
    echo "${i} $(seconds runc --criu "$criu" checkpoint --image-path "$work/img$i" --work-path "$work/w$i" "${ids[$i]}")" >> "$work/ck"
    echo "${i} $(seconds runc --criu "$criu" restore -d --image-path "$work/img$i" --work-path "$work/w$i" --bundle "$work/b$i" "${ids[$i]}")" >> "$work/rs"
  done
done
for i in "${!confs[@]}"; do
  printf '%-36s checkpoint %s s  restore %s s  (median of %d)' "${labels[$i]}" \
    "$(awk -v i="$i" '$1 == i { print $2 }' "$work/ck" | median)" "$(awk -v i="$i" '$1 == i { print $2 }' "$work/rs" | median)" "$reps"
  if [ "$i" -gt 0 ]; then
    printf ', gpucr log lines: %s' "$(grep -c 'action=' "$work/int$i/action.log" 2>/dev/null || echo 0)"
  fi
  echo
done
