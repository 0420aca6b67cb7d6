#!/usr/bin/env bash
# Engines plan for the GPU machine, from the bundle directory as root: GPU containers
# checkpointed and restored by podman and containerd themselves, with gpucr's CRIU
# integration (gpucr install-criu-integration) moving the GPU state under runc or crun.
#   bash engines_plan.sh [podman] [crun] [containerd] [kube]  (default: the first three)
# Needs bundle/ (make bundle: gpucr, CRIU, runc) and engines/ beside it (make engines:
# podman 4.3.1, conmon, containerd 1.6.20, ctr, iptables from Debian bookworm), which is
# unpacked into $GPUCR_ENGINES_PREFIX (/opt/gpucr-engines). Everything the engines keep
# lives under /dev/shm/gpucr-engines; the host's /etc is touched only for
# /etc/containers/policy.json, written when absent and removed again at the end.
#  P1. podman run --rootfs DIR (DIR: an empty directory, the host's system directories bound
#      read-only, non-recursively, as container_plan.sh does; NVIDIA devices by --device;
#      --network none) running holder.py on the GPU; podman container checkpoint, then
#      podman container restore: data on the GPU identical, a new kernel runs.
#  P2. the same root as an image (podman --import needs one: it pulls the checkpoint's
#      image): podman container checkpoint --export, then podman container restore
#      --import --name under a second podman (its own storage and state: a second node).
#  P3. P1 with crun as podman's runtime (engines/ carries the next Debian's crun 1.28 and
#      CRIU 4.2, which hand crun the integration's configuration file).
#  C1. containerd + ctr, the same image: ctr containers checkpoint --task (containerd's
#      checkpoint image; the task keeps running, as ctr leaves it), the task killed,
#      ctr containers restore --live under a new name.
#  K1. the kubelet (standalone, static pods on the host network, each given one GPU by the
#      plan's device plugin, not privileged)
#      with containerd 2.x's CRI plugin and runc, the integration installed where runc looks
#      by default (/etc/criu/runc.conf, removed again): POST /checkpoint/... on the kubelet
#      (the container keeps running), the pod deleted, the archive made a checkpoint image
#      (oci_archive.py), and a new static pod of that image restored by containerd. Needs
#      kube/ (make kube: the kubelet, containerd 2.x and crictl, unpacked into
#      /opt/gpucr-kube); works in /var/tmp/gpucr-kube.
#  K2. K1's containerd, images and integration at the CRI level, the kubelet stopped: crictl
#      runp a pod (host network), crictl create K1's container with the GPU's nodes in the
#      CRI ContainerConfig's devices (what a device plugin's Allocate or CDI resolves to),
#      crictl checkpoint --export ARCHIVE (the container keeps running), crictl rmp -f, and
#      in a new pod crictl create with ARCHIVE as the image: containerd restores it.
# Each step prints PASS or FAIL, and each GPU step checks that the integration's log shows
# the GPU state checkpointed or restored. On a failure it prints what the engines, runc,
# CRIU and the integration logged.
# GPUCR_ENGINES_WORKLOAD=counter runs test/workloads/counter (64 MiB, checked on SIGUSR1)
# instead of holder.py: the same engine mechanics on a machine without a GPU, where the
# integration never starts gpucr.
# CRIU_FAULT=130 in the plan's environment (CRIU's fault injection: no hardware breakpoints)
# reaches CRIU through the engines and runc: needed on a VM where the breakpoint CRIU sets to
# catch its parasite's exit never stops the task, so that every dump hangs (the CPU build
# machine's Linux 6.18 guest); CRIU then steps through the parasite's syscalls instead.
set -uo pipefail
cd "$(dirname "$0")"
B=$PWD; G=$B/gpucr; export GPUCR_CRIU=$B/criu/criu
ENGINES=${GPUCR_ENGINES:-$B/../engines}; PREFIX=${GPUCR_ENGINES_PREFIX:-/opt/gpucr-engines}
KUBE=${GPUCR_KUBE:-$B/../kube}; KPREFIX=${GPUCR_KUBE_PREFIX:-/opt/gpucr-kube}; KW=/var/tmp/gpucr-kube
WORKLOAD=${GPUCR_ENGINES_WORKLOAD:-holder}
W=/dev/shm/gpucr-engines
pass=0; fail=0
ok()  { echo "PASS $*"; pass=$((pass+1)); }
bad() { echo "FAIL $*"; fail=$((fail+1)); }
wait_for() { for _ in $(seq "${2:-1200}"); do compgen -G "$1" >/dev/null && return 0; sleep 0.1; done; return 1; }
secs() { date +%s.%N; }
took() { awk -v a="$1" -v b="$(secs)" 'BEGIN { printf "%.2f s", b - a }'; }

PARTS=" ${*:-podman crun containerd} "
# unpack TARXZ PREFIX HINT: TARXZ unpacked into PREFIX, once per TARXZ.
unpack() {
  local stamp; stamp=$(sha256sum "$1" | cut -c1-16) || { echo "no $1: $3"; exit 1; }
  if [ "$(cat "$2/.stamp" 2>/dev/null)" != "$stamp" ]; then
    rm -rf "$2"; mkdir -p "$2"
    tar -C "$2" -xJf "$1" && echo "$stamp" > "$2/.stamp" || { echo "unpacking $1 failed"; exit 1; }
  fi
}
[[ "$PARTS" == *" podman "* || "$PARTS" == *" crun "* || "$PARTS" == *" containerd "* ]] &&
  unpack "$ENGINES/engines.tar.xz" "$PREFIX" "make engines, carry engines/"
[[ "$PARTS" == *" kube "* ]] && unpack "$KUBE/kube.tar.xz" "$KPREFIX" "make kube, carry kube/"
# runc re-executes itself as `runc init` without its wrapper's LD_LIBRARY_PATH, so the
# host itself must be able to load runc's libraries (libseccomp).
if env -u LD_LIBRARY_PATH ldd "$B/runc/runc.bin" | grep -q "not found"; then
  echo "host lacks runc's libraries: installing the bundle's into /usr/local/lib"
  cp "$B"/runc/lib/* /usr/local/lib/ && ldconfig
fi
# iptables-restore for CRIU's network lock, CRIU and runc: the bundle's, found by the
# engines (and runc and CRIU under them) on PATH.
export PATH=$PREFIX/bin:$B/criu:$B/runc:$PATH

# podman NODE ARGS: podman with node NODE's configuration (1 or 2: two engines on one host,
# nothing shared but the kernel and the GPUs).
# Each engine command gets STEP_TIMEOUT seconds (default 240): one that hangs fails its step
# and leaves the logs to the diagnostics instead of using up the whole run.
STEP=${STEP_TIMEOUT:-240}
podman() { CONTAINERS_CONF=$W/podman-$1/containers.conf CONTAINERS_STORAGE_CONF=$W/podman-$1/storage.conf \
  CONTAINERS_REGISTRIES_CONF=$W/podman-$1/registries.conf timeout -k 10 "$STEP" podman "${@:2}"; }
ctr() { timeout -k 10 "$STEP" ctr --address "$W/containerd/containerd.sock" --namespace gpucr "$@"; }
# crictl against the kube part's containerd (its endpoint and timeout in $KW/crictl.yaml).
crictl() { timeout -k 10 "$STEP" "$KPREFIX/bin/crictl" --config "$KW/crictl.yaml" "$@"; }

# stop_kubelet: the kubelet's static pods removed, the kubelet and its device plugin stopped
# (the CRI runtime keeps running).
stop_kubelet() {
  [ -f "$KW/kubelet.pid" ] || return 0
  rm -f "$KW"/manifests/*; sleep 3; kill "$(cat "$KW/kubelet.pid")" 2>/dev/null
  [ -f "$KW/plugin.pid" ] && kill "$(cat "$KW/plugin.pid")" 2>/dev/null
  for _ in $(seq 100); do kill -0 "$(cat "$KW/kubelet.pid")" 2>/dev/null || break; sleep 0.1; done
  rm -f "$KW/kubelet.pid" "$KW/plugin.pid"
}
# stop_all: what an earlier run of this plan left running.
stop_all() {
  for n in 1 2; do [ -d "$W/podman-$n" ] && podman "$n" rm -fa >/dev/null 2>&1; done
  if [ -S "$W/containerd/containerd.sock" ]; then
    for t in $(ctr tasks ls -q 2>/dev/null); do ctr tasks kill -s SIGKILL "$t" >/dev/null 2>&1; done
    sleep 0.5
    for c in $(ctr containers ls -q 2>/dev/null); do ctr tasks rm -f "$c" >/dev/null 2>&1; ctr containers rm "$c" >/dev/null 2>&1; done
  fi
  [ -f "$W/containerd/pid" ] && kill "$(cat "$W/containerd/pid")" 2>/dev/null && sleep 1
  if [ -f "$KW/containerd.pid" ]; then
    stop_kubelet
    [ -f "$KW/crictl.yaml" ] && crictl rmp -fa >/dev/null 2>&1
    for t in $("$KPREFIX/bin/ctr" --address "$KW/containerd.sock" -n k8s.io tasks ls -q 2>/dev/null); do
      "$KPREFIX/bin/ctr" --address "$KW/containerd.sock" -n k8s.io tasks kill -s SIGKILL "$t" >/dev/null 2>&1; done
    sleep 1; kill "$(cat "$KW/containerd.pid")" 2>/dev/null; sleep 1
  fi
  for m in $(grep -o " $KW/[^ ]*" /proc/self/mountinfo | sort -r); do umount -l "$m" 2>/dev/null; done
  for m in $(grep -o " $W/[^ ]*" /proc/self/mountinfo | sort -r); do umount -l "$m" 2>/dev/null; done
}
stop_all; rm -rf "$W"; mkdir -p "$W"
# $KW holds binds of host directories while the kube part runs: never removed with one left.
if grep -q " $KW/" /proc/self/mountinfo; then echo "mounts remain under $KW: remove them first"; exit 1; fi
rm -rf "$KW"
# What the host's /etc gains for this run (podman's policy.json, the kube part's
# /etc/criu/runc.conf) is taken out again on exit.
policy=/etc/containers/policy.json; made_policy=; kube_integration=; made_kubelet_dir=
if [[ "$PARTS" == *" podman "* || "$PARTS" == *" crun "* ]] && [ ! -e "$policy" ]; then
  mkdir -p /etc/containers && cp "$PREFIX/etc/containers/policy.json" "$policy" && made_policy=1
fi
cleanup() {
  stop_all
  [ -n "$made_policy" ] && { rm -f "$policy"; rmdir /etc/containers 2>/dev/null; }
  [ -n "$kube_integration" ] && "$G" install-criu-integration --remove --crun-config "" --script "$KW/criu-action" >/dev/null &&
    [ "$kube_integration" = new ] && rmdir /etc/criu
  # The kubelet's device manager keeps its socket there whatever its root directory.
  [ -n "$made_kubelet_dir" ] && rm -rf /var/lib/kubelet
}
trap cleanup EXIT

echo "== host"; uname -r; runc --version | head -1; "$G" --version
for e in podman ctr; do command -v $e >/dev/null && command $e --version; done; echo "cgroup: $(stat -fc %T /sys/fs/cgroup)"
if [ "$WORKLOAD" = holder ]; then
  # CUDA creates /dev/nvidia-uvm on first use, which a container (its /dev is its own) cannot.
  [ -e /dev/nvidia-uvm ] || python3 -c 'import torch; torch.zeros(1, device="cuda")'
  ls /dev/nvidia*
fi

# The integration, pointed at by each container's org.criu.config annotation (the engines
# hand annotations to runc), so /etc/criu stays as it is; /etc/criu/runc.conf, the default,
# is read the same way by runc for every container.
"$G" install-criu-integration --config "$W/runc.conf" --crun-config "" --script "$W/criu-action" \
  --log "$W/action.log" --state-dir "$W/action-state" || { echo "install-criu-integration failed"; exit 1; }
touch "$W/action.log"

# The container's root: the host's own system (test/gpu/hostroot.py), as a directory for
# podman --rootfs and as a one-layer image for podman --import and containerd.
mkdir -p "$W/rootfs"
python3 "$B/hostroot.py" "$W/rootfs" > "$W/host.json" || { echo "hostroot.py failed"; exit 1; }
python3 "$B/oci_archive.py" "$W/hostroot-oci.tar" localhost/gpucr-hostroot:1 --dir "$W/rootfs" ||
  { echo "building the image failed"; exit 1; }
IMAGE=localhost/gpucr-hostroot:1
# What every container gets, in each engine's words: binds, devices, environment, command.
mapfile -t BINDS < <(python3 -c 'import json,sys; print(*json.load(open(sys.argv[1]))["binds"], sep="\n")' "$W/host.json")
mapfile -t DEVICES < <(python3 -c 'import json,sys; print(*json.load(open(sys.argv[1]))["devices"], sep="\n")' "$W/host.json")
mapfile -t ENVS < <(python3 -c 'import json,sys; print(*json.load(open(sys.argv[1]))["env"], sep="\n")' "$W/host.json")
PY3=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["python"])' "$W/host.json")
if [ "$WORKLOAD" = holder ]; then CMD=("$PY3" "$B/holder.py" 1 /x); READY=ready
else CMD=("$B/counter" -dir /x -mib 64); READY=count; DEVICES=(); fi

# podman_flags X: podman's flags for a container whose /x is X. The ulimits are the most a
# host without CAP_SYS_RESOURCE lets a container set (podman asks 1048576 open files).
podman_flags() {
  local f=(--network none --ulimit "nofile=$(ulimit -Hn)" --ulimit nproc=32768 -w /x
    --annotation "org.criu.config=$W/runc.conf"
    --mount "type=bind,source=$B,destination=$B,ro=true" --mount "type=bind,source=$1,destination=/x")
  for m in "${BINDS[@]}"; do f+=(--mount "type=bind,source=$m,destination=$m,ro=true,bind-nonrecursive=true"); done
  for d in "${DEVICES[@]}"; do f+=(--device "$d"); done
  for e in "${ENVS[@]}"; do f+=(--env "$e"); done
  printf '%s\n' "${f[@]}"
}
ctr_flags() {
  local f=(--snapshotter native --cwd /x --annotation "org.criu.config=$W/runc.conf"
    --mount "type=bind,src=$B,dst=$B,options=rbind:ro" --mount "type=bind,src=$1,dst=/x,options=rbind:rw")
  for m in "${BINDS[@]}"; do f+=(--mount "type=bind,src=$m,dst=$m,options=bind:ro"); done
  for d in "${DEVICES[@]}"; do f+=(--device "$d"); done
  for e in "${ENVS[@]}"; do f+=(--env "$e"); done
  printf '%s\n' "${f[@]}"
}

# started NAME X: waits for the workload of container NAME (exchange directory X) to be
# ready (the counter: to have counted to 20, so that one started afresh shows a lower count).
started() {
  if wait_for "$2/$READY" 1800 && { [ "$WORKLOAD" = holder ] || until_count "$2" 20; }; then ok "$1: workload started"; return 0; fi
  bad "$1: workload did not start"; return 1
}
until_count() { for _ in $(seq 100); do [ "$(cat "$1/count")" -ge "$2" ] && return 0; sleep 0.1; done; return 1; }
# before_checkpoint X: notes what tells the restored workload from one started afresh:
# the holder writes ready only when it starts, the counter counts on from at least the
# count it had before the checkpoint.
before_checkpoint() {
  if [ "$WORKLOAD" = holder ]; then rm -f "$1/ready"; else cat "$1/count" > "$1/frozen"; fi
}
# verify NAME X SIGNAL...: asks the workload to re-check its data (holder: a file; counter:
# SIGUSR1, sent by the command SIGNAL...) and expects it unchanged.
verify() {
  local name=$1 x=$2; shift 2
  rm -f "$x"/result* "$x/verify"
  if [ "$WORKLOAD" = holder ]; then
    touch "$x/verify"
    if [ -e "$x/ready" ]; then bad "$name: holder.py started afresh: not the checkpointed process"
    elif wait_for "$x/result*" 1200 && grep -q "same=True.*kernel=True" "$x"/result*; then ok "$name: $(cat "$x"/result*)"
    else bad "$name: $(cat "$x"/result* 2>/dev/null || echo no result)"; fi
  else
    local frozen before; frozen=$(cat "$x/frozen"); before=$(cat "$x/count")
    "$@" >/dev/null; wait_for "$x/verify" 100; sleep 0.3
    local now; now=$(cat "$x/count")
    if grep -q "^ok" "$x/verify" 2>/dev/null && [ "$before" -ge "$frozen" ] && [ "$now" -gt "$before" ]; then
      ok "$name: memory $(xargs < "$x/verify"), counting on from at least ${frozen// } (${now// } now)"
    else bad "$name: memory $(xargs < "$x/verify" 2>/dev/null || echo not checked), count before the checkpoint ${frozen// }, after ${before// } -> ${now// }"; fi
  fi
}
# gpu_logged NAME MARK WHAT: the integration's log gained a WHAT line since it had MARK lines
# (holder only: a CPU workload never starts gpucr).
gpu_logged() {
  [ "$WORKLOAD" = holder ] || return 0
  if tail -n +"$(($2 + 1))" "$W/action.log" | grep -q "$3"; then ok "$1: the integration logged: $3"
  else bad "$1: the integration did not log \"$3\""; fi
}
mark() { wc -l < "$W/action.log"; }

# rootfs_roundtrip PART [PODMAN_ARGS...]: a container on $W/rootfs run, checkpointed and
# restored by podman (node 1, given PODMAN_ARGS: P3's runtime), the GPU state moved by the
# integration each way and the restored workload verified.
rootfs_roundtrip() {
  local p=$1 n x f m t how; shift
  how="podman${*:+ $*}"; n=gpucr-${p,,}; x=$W/${p,,}-x; mkdir -p "$x"; mapfile -t f < <(podman_flags "$x")
  if podman 1 "$@" run -d --name "$n" "${f[@]}" --rootfs "$W/rootfs" "${CMD[@]}" >/dev/null && started "$p" "$x"; then
    before_checkpoint "$x"; m=$(mark); t=$(secs)
    if podman 1 "$@" container checkpoint "$n" >/dev/null; then
      ok "$p. $how container checkpoint ($(took "$t"))"; gpu_logged "$p" "$m" "GPU state checkpointed"
      m=$(mark); t=$(secs)
      if podman 1 "$@" container restore "$n" >/dev/null; then
        ok "$p. $how container restore ($(took "$t"))"; gpu_logged "$p" "$m" "GPU state restored"
        verify "$p. restored" "$x" podman 1 kill -s USR1 "$n"
      else bad "$p. $how container restore"; fi
    else bad "$p. $how container checkpoint"; fi
  else bad "$p. $how run --rootfs"; podman 1 logs "$n" 2>&1 | tail -20; fi
  podman 1 rm -f "$n" >/dev/null 2>&1
}

# diagnose: what the engines, runc, CRIU and the integration logged, after a failure.
diagnose() {
  echo "== diagnostics"
  find "$W" "$KW" -name '*.log' -newer "$W/host.json" -size +0 2>/dev/null | while read -r f; do
    echo "--- $f"; grep -E "Error|error|Warn" "$f" | tail -15; tail -5 "$f"
  done
  echo "--- processes"; ps -eo pid,ppid,stat,wchan:24,args | grep -E "holder|counter|criu|runc|crun|gpucr|containerd-shim" | grep -v grep
  for f in $(grep -l . /sys/fs/cgroup/*/cgroup.freeze /sys/fs/cgroup/*/*/cgroup.freeze 2>/dev/null); do
    [ "$(cat "$f")" = 1 ] && echo "frozen: ${f%/cgroup.freeze}"
  done
  dmesg 2>/dev/null | tail -10
}

if [[ "$PARTS" == *" podman "* || "$PARTS" == *" crun "* ]]; then
  for n in 1 2; do
    mkdir -p "$W/podman-$n"
    cat > "$W/podman-$n/containers.conf" <<EOF
[containers]
log_driver = "k8s-file"
seccomp_profile = "$PREFIX/share/containers/seccomp.json"
[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "$W/podman-$n/events.log"
conmon_path = ["$PREFIX/bin/conmon"]
conmon_env_vars = ["PATH=$PATH"]
helper_binaries_dir = ["$PREFIX/bin"]
init_path = "$PREFIX/bin/catatonit"
runtime = "runc"
tmp_dir = "$W/podman-$n/tmp"
static_dir = "$W/podman-$n/static"
volume_path = "$W/podman-$n/volumes"
[engine.runtimes]
runc = ["$B/runc/runc"]
[network]
network_backend = "cni"
network_config_dir = "$W/podman-$n/cni"
EOF
    printf '[storage]\ndriver = "vfs"\ngraphroot = "%s"\nrunroot = "%s"\n' "$W/podman-$n/storage" "$W/podman-$n/run" > "$W/podman-$n/storage.conf"
    echo 'unqualified-search-registries = []' > "$W/podman-$n/registries.conf"
    podman "$n" load -q -i "$W/hostroot-oci.tar" >/dev/null || bad "podman node $n: load $IMAGE"
  done
fi
if [[ "$PARTS" == *" podman "* ]]; then

  echo "== P1. podman run --rootfs: checkpoint, restore"
  rootfs_roundtrip P1

  echo "== P2. podman checkpoint --export on node 1, restore --import --name on node 2"
  x=$W/p2-x; mkdir -p "$x"; mapfile -t f < <(podman_flags "$x")
  if podman 1 run -d --name gpucr-p2 "${f[@]}" "$IMAGE" "${CMD[@]}" >/dev/null && started P2 "$x"; then
    before_checkpoint "$x"; m=$(mark); t=$(secs)
    if podman 1 container checkpoint --export "$W/p2.tar.zst" gpucr-p2 >/dev/null; then
      ok "P2. podman container checkpoint --export ($(took "$t"), $(du -h "$W/p2.tar.zst" | cut -f1))"
      gpu_logged P2 "$m" "GPU state checkpointed"
      m=$(mark); t=$(secs)
      if podman 2 container restore --import "$W/p2.tar.zst" --name gpucr-p2-node2 >/dev/null; then
        ok "P2. podman container restore --import --name on node 2 ($(took "$t"))"; gpu_logged P2 "$m" "GPU state restored"
        verify "P2. restored on node 2" "$x" podman 2 kill -s USR1 gpucr-p2-node2
      else bad "P2. podman container restore --import"; fi
    else bad "P2. podman container checkpoint --export"; fi
  else bad "P2. podman run $IMAGE"; podman 1 logs gpucr-p2 2>&1 | tail -20; fi
  podman 1 rm -f gpucr-p2 >/dev/null 2>&1; podman 2 rm -f gpucr-p2-node2 >/dev/null 2>&1
fi

if [[ "$PARTS" == *" crun "* ]]; then
  echo "== P3. podman with crun (the next Debian's crun 1.28 and CRIU 4.2): checkpoint, restore"
  CRUN=$PREFIX/crun/crun
  if ! "$CRUN" --version | grep -q "+CRIU" || ! "$PREFIX/crun/criu" --version; then
    bad "P3. crun or its CRIU does not start here: $("$CRUN" --version 2>&1 | tail -2)"
  else
    rootfs_roundtrip P3 --runtime "$CRUN"
  fi
fi

if [[ "$PARTS" == *" containerd "* ]]; then
  echo "== C1. containerd + ctr: containers checkpoint --task, restore --live"
  C=$W/containerd; mkdir -p "$C"
  printf 'version = 2\nroot = "%s"\nstate = "%s"\ndisabled_plugins = ["io.containerd.grpc.v1.cri"]\n[grpc]\n  address = "%s"\n' \
    "$C/root" "$C/state" "$C/containerd.sock" > "$C/config.toml"
  containerd --config "$C/config.toml" > "$C/containerd.log" 2>&1 & echo $! > "$C/pid"
  wait_for "$C/containerd.sock" 100
  x=$W/c1-x; mkdir -p "$x"; mapfile -t f < <(ctr_flags "$x")
  # containerd 2.x's ctr imports through its transfer service unless told --local, which
  # 1.6's ctr (this part's, from engines/) does not know.
  lf=(); ctr images import --help 2>/dev/null | grep -q -- '--local' && lf=(--local)
  if ctr images import "${lf[@]}" --snapshotter native "$W/hostroot-oci.tar" >/dev/null &&
    ctr run -d "${f[@]}" "$IMAGE" gpucr-c1 "${CMD[@]}" >/dev/null && started C1 "$x"; then
    before_checkpoint "$x"; m=$(mark); t=$(secs)
    if ctr containers checkpoint --task gpucr-c1 localhost/gpucr-c1-checkpoint:1; then
      ok "C1. ctr containers checkpoint --task ($(took "$t"))"; gpu_logged C1 "$m" "GPU state checkpointed"
      verify "C1. left running after the checkpoint" "$x" ctr tasks kill -s SIGUSR1 gpucr-c1
      ctr tasks kill -s SIGKILL gpucr-c1; sleep 1; ctr tasks rm -f gpucr-c1 >/dev/null; ctr containers rm gpucr-c1
      m=$(mark); t=$(secs)
      if ctr containers restore --live gpucr-c1-restored localhost/gpucr-c1-checkpoint:1; then
        ok "C1. ctr containers restore --live ($(took "$t"))"; gpu_logged C1 "$m" "GPU state restored"
        verify "C1. restored" "$x" ctr tasks kill -s SIGUSR1 gpucr-c1-restored
      else bad "C1. ctr containers restore --live"; fi
    else bad "C1. ctr containers checkpoint --task"; fi
  else bad "C1. ctr run $IMAGE"; fi
fi

if [[ "$PARTS" == *" kube "* ]]; then
  echo "== K1. kubelet (standalone, static pods) + containerd 2.x CRI + runc: the kubelet's checkpoint endpoint, restore as a pod from a checkpoint image"
  # On disk, not under /dev/shm: the kubelet's eviction manager needs the image filesystem's
  # device, which cAdvisor does not know for a tmpfs.
  K=$KW; KB=$KPREFIX/bin; NODE=gpucr-node; PORT=${GPUCR_KUBELET_PORT:-10350}
  mkdir -p "$K/manifests" "$K/kubelet" "$K/pause/bin" "$K/binds"
  kctr() { timeout -k 10 "$STEP" "$KB/ctr" --address "$K/containerd.sock" --namespace k8s.io "$@"; }
  # The CRI plugin with the native snapshotter, runc from the bundle, and a pause image
  # made here (a static busybox sleeping): nothing is pulled.
  # The kubelet asks for a pod sandbox's OOM score of -998: where this root may not lower its
  # own (a sandboxed build machine), containerd is told to keep it at ours instead.
  restrict_oom=false; (echo -999 > /proc/self/oom_score_adj) 2>/dev/null || restrict_oom=true
  cat > "$K/config.toml" <<EOF
version = 3
root = "$K/root"
state = "$K/state"
[grpc]
  address = "$K/containerd.sock"
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "native"
[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = "localhost/gpucr-pause:1"
[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = $restrict_oom
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
  BinaryName = "$B/runc/runc"
EOF
  PATH=$KB:$PATH "$KB/containerd" --config "$K/config.toml" > "$K/containerd.log" 2>&1 & echo $! > "$K/containerd.pid"
  wait_for "$K/containerd.sock" 100
  printf 'runtime-endpoint: unix://%s\nimage-endpoint: unix://%s\ntimeout: %s\n' "$K/containerd.sock" "$K/containerd.sock" "$STEP" > "$K/crictl.yaml"
  cp "$KB/busybox" "$K/pause/bin/"
  python3 "$B/oci_archive.py" "$K/pause-oci.tar" localhost/gpucr-pause:1 --dir "$K/pause" --entrypoint /bin/busybox \
    --entrypoint sleep --entrypoint 2147483647 >/dev/null
  kctr images import --local --snapshotter native "$K/pause-oci.tar" >/dev/null && kctr images import --local --snapshotter native "$W/hostroot-oci.tar" >/dev/null ||
    bad "K1. ctr images import"
  # runc reads /etc/criu/runc.conf for every container it checkpoints or restores that names
  # no other (the kubelet hands a pod's annotations to no runtime): the integration's default,
  # what the node DaemonSet installs (docs/kubernetes.md); taken out again at the end.
  if [ -e /etc/criu/runc.conf ]; then bad "K1. /etc/criu/runc.conf exists here: not replacing it"
  else
    [ -d /etc/criu ] && kube_integration=1 || kube_integration=new
    "$G" install-criu-integration --crun-config "" --script "$K/criu-action" --log "$W/action.log" \
      --state-dir "$K/action-state" >/dev/null || { bad "K1. install-criu-integration"; kube_integration=; }
  fi
  cat > "$K/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
staticPodPath: $K/manifests
fileCheckFrequency: 1s
syncFrequency: 2s
containerRuntimeEndpoint: unix://$K/containerd.sock
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
failSwapOn: false
address: 127.0.0.1
port: $PORT
readOnlyPort: 0
healthzPort: 0
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization: {mode: AlwaysAllow}
evictionHard: {memory.available: "1Mi", nodefs.available: "1%", imagefs.available: "1%"}
localStorageCapacityIsolation: false
featureGates: {ContainerCheckpoint: true}
EOF
  [ -e /var/lib/kubelet ] || made_kubelet_dir=1
  "$KB/kubelet" --config "$K/kubelet.yaml" --root-dir "$K/kubelet" --cert-dir "$K/pki" --hostname-override "$NODE" \
    > "$K/kubelet.log" 2>&1 & echo $! > "$K/kubelet.pid"
  # The GPUs as nvidia.com/gpu, from the plan's device plugin. A machine without one (the
  # CPU build machine) offers a node of the same numbers that nothing opens.
  DEVS=/dev
  if [ ! -e /dev/nvidia0 ]; then DEVS=$K/fakedev; mkdir -p "$DEVS"; mknod "$DEVS/nvidia0" c 195 0; fi
  "$KB/gpu-device-plugin" -dev "$DEVS" > "$K/plugin.log" 2>&1 & echo $! > "$K/plugin.pid"
  for _ in $(seq 300); do grep -q "registered" "$K/plugin.log" && break; sleep 0.2; done
  grep -q "registered" "$K/plugin.log" && ok "K1. GPU device plugin: $(grep -o 'registered.*' "$K/plugin.log")" ||
    bad "K1. GPU device plugin did not register: $(tail -2 "$K/plugin.log")"
  # Each bind a hostPath volume; the kubelet's are recursive (rbind), so each comes from a
  # non-recursive bind of its own made here: a submount (the driver's squashfs below /usr)
  # is then a volume of its own, which runc names to CRIU, not a hidden copy inside another.
  KBINDS=()
  for m in "${BINDS[@]}" "$B"; do
    mkdir -p "$K/binds$m"; mount --bind "$m" "$K/binds$m" || { bad "K1. bind $m"; continue; }
    mount -o remount,bind,ro "$K/binds$m" && KBINDS+=("$m") || { umount "$K/binds$m"; bad "K1. bind $m read-only"; }
  done
  # pod NAME IMAGE X: a static pod NAME running the workload on the GPU the device plugin
  # gives it, exchange directory X at /x.
  pod() {
    python3 "$B/static_pod.py" "$1" "$2" "$3" "$K/binds" "${KBINDS[@]}" -- "${ENVS[@]}" -- "${CMD[@]}" > "$K/$1.json" &&
      mv "$K/$1.json" "$K/manifests/" # whole: the kubelet reads a manifest as soon as it appears
  }
  # ctr_id POD: the running container of static pod POD (the kubelet names it POD-NODE).
  ctr_id() { kctr containers ls -q "labels.\"io.kubernetes.pod.name\"==$1-$NODE,labels.\"io.kubernetes.container.name\"==work" 2>/dev/null |
    while read -r c; do kctr tasks ls 2>/dev/null | awk -v c="$c" '$1 == c && $3 == "RUNNING" {print c}'; done | head -1; }
  # inspected P WHAT ARCHIVE: gpucr inspect reads the checkpoint archive ARCHIVE.
  inspected() {
    "$G" inspect "$3" >/dev/null 2>"$K/inspect.err" && ok "$1. gpucr inspect reads $2" || bad "$1. gpucr inspect $3: $(tail -1 "$K/inspect.err")"
  }
  # restored ID: containerd logged the restore of container ID.
  restored() { [ -n "$1" ] && grep -q "Restored container $1 successfully" "$K/containerd.log"; }
  # gpu_nodes DIR: the names of the GPU nodes in DIR (nvidia0 nvidia1 ...).
  gpu_nodes() {
    local d n=(); for d in "$1"/nvidia[0-9]*; do [[ ${d##*/} =~ ^nvidia[0-9]+$ ]] && n+=("${d##*/}"); done; echo "${n[*]}"
  }
  # holds_gpu P ID GIVEN: the GPU nodes in container ID's /dev are GIVEN (its GPUs' node names).
  holds_gpu() {
    local pid held; pid=$(kctr tasks ls 2>/dev/null | awk -v c="$2" '$1 == c {print $2}')
    held=$(gpu_nodes "/proc/$pid/root/dev")
    [ -n "$3" ] && [ "$held" = "$3" ] && ok "$1. the restored container holds the GPU it was given: $held" ||
      bad "$1. the restored container holds /dev/{${held}}, it was given ${3:-nothing}"
  }
  x=$W/k1-x; mkdir -p "$x"
  pod gpucr-k1 "$IMAGE" "$x"
  if started K1 "$x"; then
    before_checkpoint "$x"; m=$(mark); t=$(secs)
    resp=$(python3 "$B/static_pod.py" --post "https://127.0.0.1:$PORT/checkpoint/default/gpucr-k1-$NODE/work?timeout=600")
    archive=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["items"][0])' "$resp" 2>/dev/null)
    if [ -f "$archive" ]; then
      ok "K1. POST /checkpoint/default/gpucr-k1-$NODE/work on the kubelet ($(took "$t"), $(du -h "$archive" | cut -f1))"
      gpu_logged K1 "$m" "GPU state checkpointed"
      verify "K1. left running after the checkpoint" "$x" kctr tasks kill -s SIGUSR1 "$(ctr_id gpucr-k1)"
      inspected K1 "the kubelet's archive" "$archive"
      rm "$K/manifests/gpucr-k1.json"
      for _ in $(seq 300); do [ -z "$(ctr_id gpucr-k1)" ] && break; sleep 0.2; done
      [ -z "$(ctr_id gpucr-k1)" ] && ok "K1. the pod deleted (its manifest removed)" || bad "K1. the pod still runs"
      # The checkpoint image: the archive as a layer (what checkpointctl build or buildah
      # make), annotated as a checkpoint, imported as a registry pull would leave it.
      python3 "$B/oci_archive.py" "$K/checkpoint-oci.tar" localhost/gpucr-k1-checkpoint:1 --layer "$archive" \
        --annotation org.criu.checkpoint.container.name=work && kctr images import --local --snapshotter native "$K/checkpoint-oci.tar" >/dev/null ||
        bad "K1. building and importing the checkpoint image"
      m=$(mark); t=$(secs)
      pod gpucr-k1r localhost/gpucr-k1-checkpoint:1 "$x"
      for _ in $(seq 3000); do id=$(ctr_id gpucr-k1r); restored "$id" && break; sleep 0.1; done
      if restored "$id"; then
        ok "K1. a pod restored from the checkpoint image ($(took "$t"))"; gpu_logged K1 "$m" "GPU state restored"
        verify "K1. restored" "$x" kctr tasks kill -s SIGUSR1 "$id"
        # The restored container holds the nodes of the GPU the plugin allocated the new pod.
        holds_gpu K1 "$id" "$(grep -o 'allocated \[[^]]*\]' "$K/plugin.log" | tail -1 | tr -d '[]' | cut -d' ' -f2-)"
      else bad "K1. no pod restored from the checkpoint image"; grep -iE "error|fail" "$K/kubelet.log" | tail -5; fi
    else bad "K1. POST /checkpoint on the kubelet: ${resp:-no answer}"; fi
  else bad "K1. the static pod did not start"; grep -iE "error|fail" "$K/kubelet.log" | tail -10; fi

  echo "== K2. crictl + the same containerd 2.x CRI: crictl checkpoint --export, a container restored from the archive as its image"
  # The kubelet removes pods it did not make: stopped first, then what remains of K1's pods.
  stop_kubelet; crictl rmp -fa >/dev/null
  # The GPU as a device plugin's Allocate (or CDI) resolves it, handed over in the CRI
  # ContainerConfig's devices: its node and the driver's control nodes there are.
  gpu=$(gpu_nodes "$DEVS"); gpu=${gpu%% *}
  GPUNODES=$DEVS/$gpu; for n in nvidiactl nvidia-uvm nvidia-uvm-tools; do [ -e "$DEVS/$n" ] && GPUNODES+=,$DEVS/$n; done
  # cri_pod NAME IMAGE: crictl runp a pod sandbox NAME, crictl create its container "work" of
  # IMAGE (K1's container, exchange directory $x) in it: the IDs in kpod and kid.
  cri_pod() {
    kpod=; kid=; mkdir -p "$K/logs/$1"
    python3 "$B/static_pod.py" --cri-sandbox "$1" "$K/logs/$1" > "$K/$1-pod.json" &&
      python3 "$B/static_pod.py" --cri-container "$GPUNODES" "$2" "$x" "$K/binds" "${KBINDS[@]}" -- "${ENVS[@]}" -- "${CMD[@]}" > "$K/$1-ctr.json" &&
      kpod=$(crictl runp "$K/$1-pod.json") && kid=$(crictl create --no-pull "$kpod" "$K/$1-ctr.json" "$K/$1-pod.json")
  }
  # cri_gone P: pod $kpod removed by crictl rmp -f (kpod emptied), its container's task gone.
  cri_gone() {
    if crictl rmp -f "$kpod" >/dev/null && kpod= && ! kctr tasks ls -q 2>/dev/null | grep -qx "$kid"; then ok "$1: crictl rmp -f"
    else bad "$1: crictl rmp -f: ${kpod:-the pod removed, container $kid still running}"; fi
  }
  x=$W/k2-x; mkdir -p "$x"
  if cri_pod gpucr-k2 "$IMAGE" && crictl start "$kid" >/dev/null && started K2 "$x"; then
    before_checkpoint "$x"; m=$(mark); t=$(secs); archive=$K/k2-checkpoint.tar
    if crictl checkpoint --export="$archive" "$kid" >/dev/null && [ -f "$archive" ]; then
      ok "K2. crictl checkpoint --export ($(took "$t"), $(du -h "$archive" | cut -f1))"
      gpu_logged K2 "$m" "GPU state checkpointed"
      verify "K2. left running after the checkpoint" "$x" kctr tasks kill -s SIGUSR1 "$kid"
      inspected K2 "crictl's archive" "$archive"
      cri_gone "K2. the pod removed"
      # containerd 2.x's CreateContainer takes an image that is a file as a checkpoint archive.
      m=$(mark); t=$(secs)
      if cri_pod gpucr-k2r "$archive" && crictl start "$kid" >/dev/null && restored "$kid"; then
        ok "K2. crictl create with the archive as its image, crictl start: restored by containerd ($(took "$t"))"
        gpu_logged K2 "$m" "GPU state restored"
        verify "K2. restored" "$x" kctr tasks kill -s SIGUSR1 "$kid"
        holds_gpu K2 "$kid" "$gpu"
        cri_gone "K2. the restored pod removed"
      else bad "K2. no container restored from the archive"; grep -iE "error|fail" "$K/containerd.log" | tail -5; fi
    else bad "K2. crictl checkpoint --export"; fi
  else bad "K2. crictl runp, create, start $IMAGE"; grep -iE "error|fail" "$K/containerd.log" | tail -10; fi
  [ -z "$kpod" ] || crictl rmp -f "$kpod" >/dev/null # what a failed step left
fi

echo "== the integration's log"; cat "$W/action.log"
[ "$fail" -eq 0 ] || diagnose
echo "engines plan: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
