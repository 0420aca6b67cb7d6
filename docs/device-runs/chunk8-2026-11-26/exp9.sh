#!/usr/bin/env bash
# Device run 67: restore --from MinIO (--no-compat, /dev/shm) of one 16 GiB holder by three
# builds, against the local restore, in rotating order, every restore verified:
#   a = 19f170c (8 MiB chunks), b = 1003964 (+ chunks hashed as they arrive),
#   c = the bundle's build (+ chunks fetched ahead of the fill while CRIU restores).
set -u
if [ -z "${REAPED:-}" ]; then
  mkdir -p bundle && tar -xJf storebench/bundle.tar.xz -C bundle && xz -dc storebench/minio.xz > bundle/minio && chmod +x bundle/minio
  for g in a b; do xz -dc storebench/gpucr-$g.xz > bundle/gpucr-$g && chmod +x bundle/gpucr-$g; done
  exec env REAPED=1 python3 bundle/subreaper.py bash "$0"
fi
cd bundle; B=$PWD; export GPUCR_CRIU=$B/criu/criu
pkill -f "minio server"; pkill -9 -f holder.py; sleep 1; D=/dev/shm/e9-$$; rm -rf $D; mkdir -p $D/minio/e4b $D/w
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
  local i; touch $D/w/verify; for i in $(seq 600); do r=$(cat $D/w/result* 2>/dev/null); [ -n "$r" ] && break; sleep 0.1; done
  echo "  verified: $r"; rm -f $D/w/result*; kill -9 $1; for i in $(seq 200); do [ -e /proc/$1 ] || break; sleep 0.05; done; }
phases() { python3 -c "
import json,sys; t=open(sys.argv[1]).read(); d=json.loads(t[t.index('{'):])
if 'totalSeconds' not in d: print(t[-400:]); sys.exit()
s=d.get('streamed'); s=s if isinstance(s,dict) else {}
print('  total=%.2f'%d['totalSeconds'], ' '.join('%s=%.2f'%(p['name'],p['seconds']) for p in d['phases']), 'fetch=%.2f'%s['fetchSeconds'] if s else '')" $1; }
run() { # label cmd...: the command's phases, with MinIO's and gpucr's CPU ticks
  local m0 c0 l=$1; shift; m0=$(mt); c0=$(ct); "$@" > $D/out.json 2>$D/err.txt
  echo "$l: rc=$? minio $(( $(mt)-m0 )) ticks, gpucr $(( $(ct)-c0 )) ticks"; phases $D/out.json; }
rpid() { sed -n 's/^ *"rootPid": *\([0-9]*\).*/\1/p' $D/out.json | head -1; }
P=$(start); run "ckpt-local leave-running" ./gpucr checkpoint $P -D $D/img --leave-running --json
run "ckpt-to" ./gpucr checkpoint $P --to s3://e4b/r/h --json
for k in 1 2 3; do
  case $k in 1) order="local a b c";; 2) order="c b a local";; 3) order="b local c a";; esac
  for g in $order; do
    if [ $g = local ]; then run "rst-local $k" ./gpucr restore -D $D/img --json
    else G=./gpucr; [ $g != c ] && G=./gpucr-$g; run "rst-from $g $k" $G restore --from s3://e4b/r/h --json; fi
    verify_kill $(rpid)
  done
done
rm -rf $D
echo "(ticks: 1/100 s of CPU; MinIO's from /proc/PID/stat, gpucr's as the script's waited-for children)"
