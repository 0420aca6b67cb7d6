#!/usr/bin/env bash
# Device run 65: 8 MiB chunks (a chunk is one image piece, its xxh64 taken once) and the
# memory save read straight into the stream's buffers, against b279ec5 (4 MiB chunks):
# checkpoint --to and restore --from a MinIO (--no-compat, data on /dev/shm) on the same
# machine, alternating builds, every restore verified; then the local checkpoint/restore.
# Also the restored holder's AnonHugePages, and gpucr's CPU per command.
set -u
if [ -z "${REAPED:-}" ]; then
  mkdir -p bundle && tar -xJf storebench/bundle.tar.xz -C bundle && xz -dc storebench/minio.xz > bundle/minio && chmod +x bundle/minio
  xz -dc storebench/gpucr-old.xz > bundle/gpucr-old && chmod +x bundle/gpucr-old
  exec env REAPED=1 python3 bundle/subreaper.py bash "$0"
fi
cd bundle; B=$PWD; export GPUCR_CRIU=$B/criu/criu
pkill -f "minio server"; pkill -9 -f holder.py; sleep 1; D=/dev/shm/e7-$$; rm -rf $D; mkdir -p $D/minio/e4b $D/w
MINIO_ROOT_USER=e4user MINIO_ROOT_PASSWORD=e4secret123 setsid ./minio server --quiet --address 127.0.0.1:9400 --console-address 127.0.0.1:9401 --no-compat $D/minio </dev/null >$D/minio.log 2>&1 &
MP=$!; trap "kill $MP" EXIT
export GPUCR_S3_ENDPOINT=http://127.0.0.1:9400 AWS_ACCESS_KEY_ID=e4user AWS_SECRET_ACCESS_KEY=e4secret123 AWS_REGION=us-east-1
for i in $(seq 100); do ./gpucr ls s3://e4b >/dev/null 2>&1 && break; sleep 0.3; done
mt() { awk '{print $14+$15}' /proc/$MP/stat; }
ct() { awk '{print $16+$17}' /proc/$$/stat; }
start() { rm -rf $D/w; mkdir -p $D/w; setsid python3 holder.py 16 $D/w </dev/null >/dev/null 2>$D/w/err & disown
  local i; for i in $(seq 600); do [ -s $D/w/ready ] && break; sleep 0.1; done; cut -d' ' -f1 $D/w/ready; }
verify_kill() { # pid (the holder is the only one left: pkill at the start)
  [ -n "${1:-}" ] || { echo "  no restored pid"; return; }
  echo "  $(grep AnonHugePages /proc/$1/smaps_rollup | tr -s ' ')"
  local i; touch $D/w/verify; for i in $(seq 600); do r=$(cat $D/w/result* 2>/dev/null); [ -n "$r" ] && break; sleep 0.1; done
  echo "  verified: $r"; rm -f $D/w/result*; kill -9 $1; for i in $(seq 200); do [ -e /proc/$1 ] || break; sleep 0.05; done; }
phases() { python3 -c "
import json,sys; t=open(sys.argv[1]).read(); d=json.loads(t[t.index('{'):])
if 'totalSeconds' not in d: print(t[-400:]); sys.exit()
print('  total=%.2f'%d['totalSeconds'], ' '.join('%s=%.2f'%(p['name'],p['seconds']) for p in d['phases']))" $1; }
run() { # label cmd...: the command's phases, with MinIO's and gpucr's CPU ticks
  local m0 c0 l=$1; shift; m0=$(mt); c0=$(ct); "$@" > $D/out.json 2>$D/err.txt
  echo "$l: rc=$? minio $(( $(mt)-m0 )) ticks, gpucr $(( $(ct)-c0 )) ticks"; phases $D/out.json; }
for round in 1 2; do
  order="old new"; [ $round = 2 ] && order="new old"
  for g in $order; do G=./gpucr; [ $g = old ] && G=./gpucr-old
    P=$(start); run "ckpt-to $g r$round" $G checkpoint $P --to s3://e4b/$g$round/h --json; done
  for k in 1 2; do for g in $order; do G=./gpucr; [ $g = old ] && G=./gpucr-old
    run "rst-from $g r$round.$k" $G restore --from s3://e4b/$g$round/h --json
    P=$(sed -n 's/^ *"rootPid": *\([0-9]*\).*/\1/p' $D/out.json | head -1); verify_kill $P
  done; done
  for g in old new; do ./gpucr rm s3://e4b/$g$round/h >/dev/null 2>&1 || echo "rm $g$round failed"; done
done
P=$(start); run "ckpt-local" ./gpucr checkpoint $P -D $D/img --json
for j in 1 2 3; do run "rst-local $j" ./gpucr restore -D $D/img --json
  P=$(sed -n 's/^ *"rootPid": *\([0-9]*\).*/\1/p' $D/out.json | head -1); verify_kill $P; done
du -sh $D/minio; rm -rf $D
echo "(ticks: 1/100 s of CPU; MinIO's from /proc/PID/stat, gpucr's as the script's waited-for children)"
