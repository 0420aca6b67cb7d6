#!/usr/bin/env bash
# Device benchmark for streamed images (issue 18), run as root on the GPU machine from the
# bundle directory (make bundle copies this script there; make storebench carries the bundle
# with a MinIO server, see docs/storage.md):
#   bash bench-stream.sh [GIB] [REPS]        (default: 16 GiB, 1 repetition)
# Every restore is verified by the restored workload, then the workload is killed.
# Workloads, WORKLOADS (default "holder model"):
#   holder   holder.py keeps GIB GiB of seeded random data on the GPU (same data, a new kernel)
#   model    model.py, the Llama-shaped 2.6B bf16 model serving greedy generation (weights and
#            generated tokens identical); asked to verify before each of its restores starts, it
#            generates one token as soon as it runs again: first-token is the time from the
#            restore's start to that token, checked against the wanted generation
#   counter  test/workloads/counter holding GIB GiB of random memory on the CPU: this script's
#            plumbing (stores, MinIO, tables) on a machine without a GPU
# Stores, STORES (default "local shm disk" when a MinIO server is at MINIO, default ./minio;
# else "local"):
#   local    a local store at STORE (default /dev/shm/gpucr-stream-store; an s3:// URL there,
#            with GPUCR_S3_ENDPOINT and AWS_* set, uses that service)
#   shm      MinIO on 127.0.0.1, its data on /dev/shm
#   disk     MinIO on 127.0.0.1, its data on disk (under /var/tmp)
# MinIO runs with throwaway credentials on a free loopback port (BENCH_MINIO_FLAGS: more flags
# of its server, e.g. --no-compat, which spares it an MD5 of every object it stores; not in a
# MINIO_* variable, which MinIO would read as its own), its bucket made as a directory at the
# top of its data (which MinIO serves as a bucket: the device has no S3 client), and is stopped
# with its data removed at the end of its pass.
# Per repetition, wall times: first, once for all stores,
#   ckpt-local, rst-local   checkpoint -D IMG (on /dev/shm), then restore -D IMG
#   user                    today's path: checkpoint -D on DISK, cp -a of the image (the move to
#                           another host), restore -D of the copy (not for the model)
# then per store:
#   push                    push IMG (that same image) into the store
#   rst-from                restore --from of it: memory filled straight from the store's chunks
#   ckpt-to, rst-from2      checkpoint --to the store (no local image), restore --from of it
#                           (not for the model: it would have to be loaded again per store)
# and one table per store with the ratios the issue asks for: rst-from / rst-local and ckpt-to /
# ckpt-local (target <= 1.3 each), and user / (ckpt-to + rst-from2). Every table is printed when
# its pass ends. JSON lines of every measurement in $OUT/bench-stream.jsonl, each command's
# output (the restores' JSON with their phases) beside it.
# Time on an H100 with the defaults, estimated from docs/device-runs.md (runs 27 and 29: a
# 16 GiB holder checkpoints in 6-11 s, restores in 4-7 s, today's path takes ~34 s; gpucr-bench's
# log in bench-h100-1-4-16GiB-model-final: the holder starts in ~5 s, the model in ~18 s and
# restores in ~2 s): about 5-6 minutes, pushes and MinIO on disk being the unknown part.
# USER_PATH=0 leaves today's path out (~40 s).
set -uo pipefail
# Restored workloads are orphans, and this machine's PID 1 reaps orphans slowly: a zombie holds
# the PID that the next restore of the same image needs. The script runs under a subreaper
# that reaps them at once.
if [ -z "${BENCH_REAPER:-}" ]; then
  exec env BENCH_REAPER=1 python3 "$(dirname "$0")/subreaper.py" bash "$0" "$@"
fi
cd "$(dirname "$0")" || exit 1
B=$PWD
GIB=${1:-16}; REPS=${2:-1}
export GPUCR_CRIU=${GPUCR_CRIU:-$B/criu/criu}
G=${GPUCR:-$B/gpucr}; COUNTER=${COUNTER:-$B/counter}; MINIO=${MINIO:-$B/minio}
WORKLOADS=${WORKLOADS:-holder model}
if [ -x "$MINIO" ]; then STORES=${STORES:-local shm disk}; else STORES=${STORES:-local}; fi
W=/dev/shm/gpucr-bench-stream; DISK=${DISK:-/var/tmp/gpucr-bench-stream}
STORE=${STORE:-/dev/shm/gpucr-stream-store}
OUTD=${OUT:-/tmp/gpucr-out}; mkdir -p "$OUTD"; J=$OUTD/bench-stream.jsonl; : > "$J"
BUCKET=gpucr-bench
fail=0
bad() { echo "FAIL $*"; fail=$((fail+1)); }
now() { date +%s.%N; }
calc() { python3 -c 'import sys; print(round(eval(sys.argv[1]), 2))' "$1" 2>/dev/null || echo nan; }
wait_file() { for _ in $(seq 1800); do [ -s "$1" ] && return 0; sleep 0.1; done; return 1; }

# --- stores -----------------------------------------------------------------------------------
MPID=""; MDATA=""
# minio_start DATA NAME: starts MinIO with its data in DATA, the bucket made, its log in
# $OUTD/minio-NAME.log, and points gpucr at it.
minio_start() {
  MDATA=$1; rm -rf "$MDATA"; mkdir -p "$MDATA/$BUCKET"
  local port cport log=$OUTD/minio-$2.log margs
  read -ra margs <<< "${BENCH_MINIO_FLAGS:-}"
  read -r port cport < <(python3 -c 'import socket
ss = [socket.socket() for _ in range(2)]
for s in ss: s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in ss))')
  MINIO_ROOT_USER=gpucr-bench MINIO_ROOT_PASSWORD=gpucr-bench-secret MINIO_BROWSER=off \
    MINIO_UPDATE=off MINIO_CI_CD=1 setsid "$MINIO" server --quiet --address "127.0.0.1:$port" \
    --console-address "127.0.0.1:$cport" "${margs[@]}" "$MDATA" </dev/null > "$log" 2>&1 &
  MPID=$!
  export GPUCR_S3_ENDPOINT=http://127.0.0.1:$port AWS_ACCESS_KEY_ID=gpucr-bench \
    AWS_SECRET_ACCESS_KEY=gpucr-bench-secret AWS_REGION=us-east-1
  # gpucr opens the bucket before listing it: this answers once MinIO serves the bucket.
  for _ in $(seq 300); do
    "$G" ls "s3://$BUCKET" >/dev/null 2>&1 && return 0
    kill -0 "$MPID" 2>/dev/null || break
    sleep 0.2
  done
  echo "MinIO did not serve s3://$BUCKET: $(tail -3 "$log")"; minio_stop; return 1
}
minio_stop() {
  if [ -n "$MPID" ]; then
    kill "$MPID" 2>/dev/null
    for _ in $(seq 100); do kill -0 "$MPID" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$MPID" 2>/dev/null; wait "$MPID" 2>/dev/null
  fi
  [ -n "$MDATA" ] && rm -rf "$MDATA"
  MPID=""; MDATA=""
  unset GPUCR_S3_ENDPOINT AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY AWS_REGION
}
# store_start KIND: makes the store ready; sets URL (where checkpoints go) and WHERE (its name).
store_start() {
  case $1 in
    local) URL=$STORE; WHERE="store $STORE"
      case "$STORE" in s3://*) ;; *) rm -rf "$STORE"; mkdir -p "$STORE";; esac ;;
    shm) URL=s3://$BUCKET; WHERE="MinIO on 127.0.0.1, data on /dev/shm"; minio_start "$W-minio" shm ;;
    disk) URL=s3://$BUCKET; WHERE="MinIO on 127.0.0.1, data on disk ($DISK-minio)"; minio_start "$DISK-minio" disk ;;
    *) echo "unknown store $1 (local, shm, disk)"; return 1 ;;
  esac
}
store_stop() {
  case $1 in local) case "$STORE" in s3://*) ;; *) rm -rf "$STORE";; esac ;; *) minio_stop ;; esac
}
# shellcheck disable=SC2317 # run by the EXIT trap
cleanup() { minio_stop; rm -rf "$W" "$DISK"; case "$STORE" in s3://*) ;; *) rm -rf "$STORE";; esac; }
trap cleanup EXIT
trap 'exit 1' INT TERM

# --- workloads --------------------------------------------------------------------------------
declare -A PID V
# start WL: starts workload WL in $W/WL and waits until it is ready; PID[WL] is its pid.
start() {
  local d=$W/$1; rm -rf "$d"; mkdir -p "$d"
  case $1 in
    holder) setsid python3 "$B/holder.py" "$GIB" "$d" </dev/null >/dev/null 2>"$d/err" & ;;
    model) setsid python3 "$B/model.py" "$d" </dev/null >/dev/null 2>"$d/err" & ;;
    counter) setsid "$COUNTER" -dir "$d" -random-mib "$(calc "int($GIB * 1024)")" </dev/null >/dev/null 2>"$d/err" &
      PID[counter]=$! ;;
    *) echo "unknown workload $1 (holder, model, counter)"; exit 1 ;;
  esac
  disown # it is killed by its checkpoint or by stop: no job notices
  if [ "$1" = counter ]; then wait_file "$d/count"; else wait_file "$d/ready"; fi ||
    { echo "$1 did not start: $(tail -3 "$d/err")"; exit 1; }
  [ "$1" = counter ] || PID[$1]=$(cut -d' ' -f1 "$d/ready")
}
# stop WL: kills the workload and waits until its pid is free for the next restore.
stop() {
  kill -9 "${PID[$1]}" 2>/dev/null
  for _ in $(seq 600); do [ -e "/proc/${PID[$1]}" ] || break; sleep 0.05; done
}
# record KEY SECONDS [BUSY]: keeps a measurement (KEY: WL.STORE.STEP.REP, STORE "-" for a
# local one; SECONDS nan for a step that failed; BUSY the cores the whole machine kept busy
# meanwhile, on average).
record() {
  V[$1]=$2
  local wl store step rep secs=$2 busy=${3:-null}; IFS=. read -r wl store step rep <<< "$1"
  [ "$secs" = nan ] && secs=null
  echo "{\"rep\":$rep,\"gib\":$GIB,\"workload\":\"$wl\",\"store\":\"$store\",\"step\":\"$step\",\"seconds\":$secs,\"busyCores\":$busy}" >> "$J"
}
# busy_ticks: the clock ticks every core of the machine has spent busy since boot (/proc/stat:
# all but idle and iowait), to tell a step bound by the machine's cores from one that waits.
busy_ticks() { awk '/^cpu /{print $2+$3+$4+$7+$8+$9; exit}' /proc/stat; }
# timed KEY CMD...: runs CMD, its output in $OUTD/KEY.out; records its wall time as KEY (nan
# if it failed), started at $S, and how many cores were busy meanwhile.
timed() {
  local key=$1 t b busy; shift
  b=$(busy_ticks); S=$(now)
  if "$@" > "$OUTD/$key.out" 2>&1; then t=$(calc "$(now) - $S"); else bad "$key: $(tail -1 "$OUTD/$key.out")"; t=nan; fi
  busy=$(calc "($(busy_ticks) - $b) / $(getconf CLK_TCK) / $t")
  echo "$key: $t s, $busy cores busy"
  record "$key" "$t" "$busy"
  [ "$t" != nan ]
}
# restored WL KEY CMD...: times the restore CMD (--json) as KEY and checks what it restored,
# then kills it. The model is asked to verify before the restore starts, so that it answers as soon as it
# runs again: its first token is recorded as KEY with the step first-<step>.
restored() {
  local wl=$1 key=$2 d=$W/$1 r="" f k step; shift 2
  rm -f "$d"/result* "$d"/first* "$d"/verify
  [ "$wl" = model ] && touch "$d/verify"
  timed "$key" "$@" || { stop "$wl"; return; }
  # The restored tree's pid: the image's, not that of the workload last started.
  PID[$wl]=$(sed -n 's/^ *"rootPid": *\([0-9]*\).*/\1/p' "$OUTD/$key.out" | head -1)
  [ -n "${PID[$wl]}" ] || { bad "$key: no rootPid in its JSON"; return; }
  case $wl in
    counter) kill -USR1 "${PID[$wl]}"; wait_file "$d/verify"; r=$(cat "$d/verify" 2>/dev/null) ;;
    holder) touch "$d/verify" ;;
  esac
  if [ "$wl" = model ]; then
    IFS=. read -r _ _ step _ <<< "$key"; k=${key/.$step./.first-$step.}
    if wait_file "$d/first1"; then
      f=$(cat "$d/first1")
      case $f in first=True*) record "$k" "$(calc "${f##*t=} - $S")" ;; *) bad "$key: first token: $f"; record "$k" nan ;; esac
    else bad "$key: no first token in 180 s"; record "$k" nan; fi
  fi
  # A workload opens its result file before writing its line: wait for the line.
  if [ "$wl" != counter ]; then
    for _ in $(seq 1800); do r=$(cat "$d"/result* 2>/dev/null); [ -n "$r" ] && break; sleep 0.1; done
  fi
  case $wl:$r in holder:*same=True*kernel=True* | model:*same=True* | counter:ok*) ;; *) bad "$key: restored state not verified: $r" ;; esac
  stop "$wl"
}

# local_pass WL REP: checkpoint to $W/img-WL (kept for the stores' pushes) and restore it.
local_pass() {
  start "$1"
  timed "$1.-.ckpt-local.$2" "$G" checkpoint "${PID[$1]}" -D "$W/img-$1" --json
  restored "$1" "$1.-.rst-local.$2" "$G" restore -D "$W/img-$1" --json
}
# user_pass WL REP: today's path, checkpoint to disk, copy, restore the copy.
user_pass() {
  local k=$1.-.user
  rm -rf "$DISK"; mkdir -p "$DISK"
  start "$1"
  timed "$k-ckpt.$2" "$G" checkpoint "${PID[$1]}" -D "$DISK/a" --json
  timed "$k-copy.$2" cp -a "$DISK/a" "$DISK/b"
  restored "$1" "$k-restore.$2" "$G" restore -D "$DISK/b" --json
  record "$k.$2" "$(calc "${V[$k-ckpt.$2]} + ${V[$k-copy.$2]} + ${V[$k-restore.$2]}")"
  rm -rf "$DISK"
}
# store_pass WL KIND REP: push of the local image and its restore --from; checkpoint --to and
# its restore --from. Each is deleted again (its chunks too) so the next finds none stored.
store_pass() {
  local wl=$1 kind=$2 rep=$3
  timed "$wl.$kind.push.$rep" "$G" push "$W/img-$wl" "$URL/$wl-push-$rep/img" --json
  restored "$wl" "$wl.$kind.rst-from.$rep" "$G" restore --from "$URL/$wl-push-$rep/img" --json
  "$G" rm "$URL/$wl-push-$rep/img" >/dev/null || bad "$wl.$kind: rm of the pushed image"
  [ "$wl" = model ] && return
  start "$wl"
  timed "$wl.$kind.ckpt-to.$rep" "$G" checkpoint "${PID[$wl]}" --to "$URL/$wl-stream-$rep/ckpt" --json
  restored "$wl" "$wl.$kind.rst-from2.$rep" "$G" restore --from "$URL/$wl-stream-$rep/ckpt" --json
  "$G" rm "$URL/$wl-stream-$rep/ckpt" >/dev/null || bad "$wl.$kind: rm of the streamed checkpoint"
}
v() { echo "${V[$1]:--}"; }
# table KIND REP: the measurements of one store, and the ratios.
table() {
  local kind=$1 rep=$2 wl c
  echo "== rep $rep, store $kind: $WHERE (seconds)"
  printf '%-8s %10s %10s %10s %10s %10s %10s %10s %10s %10s  %s\n' workload ckpt-local rst-local user push \
    rst-from ckpt-to rst-from2 first-local first-from ratios
  for wl in $WORKLOADS; do
    c="restore-from/local $(calc "$(v "$wl.$kind.rst-from.$rep") / $(v "$wl.-.rst-local.$rep")")"
    if [ "$wl" != model ]; then
      c+=", ckpt-to/local $(calc "$(v "$wl.$kind.ckpt-to.$rep") / $(v "$wl.-.ckpt-local.$rep")")"
      [ -n "${V[$wl.-.user.$rep]:-}" ] && c+=", user/(ckpt-to+restore-from) $(calc \
        "$(v "$wl.-.user.$rep") / ($(v "$wl.$kind.ckpt-to.$rep") + $(v "$wl.$kind.rst-from2.$rep"))")"
    fi
    printf '%-8s %10s %10s %10s %10s %10s %10s %10s %10s %10s  %s\n' "$wl" "$(v "$wl.-.ckpt-local.$rep")" \
      "$(v "$wl.-.rst-local.$rep")" "$(v "$wl.-.user.$rep")" "$(v "$wl.$kind.push.$rep")" \
      "$(v "$wl.$kind.rst-from.$rep")" "$(v "$wl.$kind.ckpt-to.$rep")" "$(v "$wl.$kind.rst-from2.$rep")" \
      "$(v "$wl.-.first-rst-local.$rep")" "$(v "$wl.$kind.first-rst-from.$rep")" "$c"
  done
}

echo "== host"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
echo "$(nproc) cores; $("$G" --version); workloads: $WORKLOADS; stores: $STORES; $GIB GiB; MinIO flags: ${BENCH_MINIO_FLAGS:-none}"
for kind in $STORES; do
  case $kind in shm | disk) [ -x "$MINIO" ] || { echo "no MinIO server at $MINIO for store $kind (MINIO=...)"; exit 1; } ;; esac
done
for rep in $(seq "$REPS"); do
  rm -rf "$W"; mkdir -p "$W"
  for wl in $WORKLOADS; do local_pass "$wl" "$rep"; done
  if [ "${USER_PATH:-1}" = 1 ]; then
    for wl in $WORKLOADS; do [ "$wl" = model ] || user_pass "$wl" "$rep"; done
  fi
  for kind in $STORES; do
    if store_start "$kind"; then
      for wl in $WORKLOADS; do store_pass "$wl" "$kind" "$rep"; done
    else
      bad "store $kind did not start"
    fi
    store_stop "$kind"
    table "$kind" "$rep"
  done
done
echo "each restore's JSON (phases, what was streamed): $OUTD/WORKLOAD.STORE.STEP.REP.out"
[ "$fail" = 0 ] && { echo "PASS every restore verified"; exit 0; }
echo "FAIL $fail"; exit 1
