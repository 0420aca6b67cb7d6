#!/usr/bin/env bash
# Device run 92: checkpoint --to MinIO (--no-compat, /dev/shm), 16 GiB holders: 38f94a5 (old)
# against this build (new: chunk digests taken as the bytes arrive, CRC32C taken as the
# frame is written), alternating, 3 each, beside a local checkpoint each round; MinIO's and
# gpucr's CPU ticks; the last new one with a CPU profile, then restored --from the store and
# verified by the holder.
set -u
if [ -z "${REAPED:-}" ]; then
  mkdir -p bundle && tar -xJf storebench/bundle.tar.xz -C bundle && xz -dc storebench/minio.xz > bundle/minio && chmod +x bundle/minio
  xz -dc storebench/gpucr-old.xz > bundle/gpucr-old && chmod +x bundle/gpucr-old
  exec env REAPED=1 python3 bundle/subreaper.py bash "$0"
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
cd bundle; B=$PWD; export GPUCR_CRIU=$B/criu/criu; ./gpucr version; ./gpucr-old version
pkill -f "[m]inio server"; pkill -9 -f "[h]older.py"; sleep 1; D=/dev/shm/e14-$$; rm -rf $D; mkdir -p $D/minio/e4b $D/w
MINIO_ROOT_USER=e4user MINIO_ROOT_PASSWORD=e4secret123 setsid ./minio server --quiet --address 127.0.0.1:9400 --console-address 127.0.0.1:9401 --no-compat $D/minio </dev/null >$D/minio.log 2>&1 &
MP=$!; trap "kill $MP" EXIT
export GPUCR_S3_ENDPOINT=http://127.0.0.1:9400 AWS_ACCESS_KEY_ID=e4user AWS_SECRET_ACCESS_KEY=e4secret123 AWS_REGION=us-east-1
for i in $(seq 100); do ./gpucr ls s3://e4b >/dev/null 2>&1 && break; sleep 0.3; done
mt() { awk '{print $14+$15}' /proc/$MP/stat; }
ct() { awk '{print $16+$17}' /proc/$$/stat; }
start() { rm -rf $D/w; mkdir -p $D/w; setsid python3 holder.py 16 $D/w </dev/null >/dev/null 2>$D/w/err & disown
  local i; for i in $(seq 600); do [ -s $D/w/ready ] && break; sleep 0.1; done; cut -d' ' -f1 $D/w/ready; }
verify_kill() { [ -n "${1:-}" ] || { echo "  no restored pid"; return; }
  local i r; touch $D/w/verify; for i in $(seq 600); do r=$(cat $D/w/result* 2>/dev/null); [ -n "$r" ] && break; sleep 0.1; done
  echo "  verified: $r"; rm -f $D/w/result*; kill -9 $1; for i in $(seq 200); do [ -e /proc/$1 ] || break; sleep 0.05; done; }
phases() { python3 -c "
import json,sys; t=open(sys.argv[1]).read(); d=json.loads(t[t.index('{'):])
if 'totalSeconds' not in d: print(t[-400:]); sys.exit()
print('  total=%.2f'%d['totalSeconds'], ' '.join('%s=%.2f'%(p['name'],p['seconds']) for p in d['phases']))" $1; }
run() { local m0 c0 l=$1; shift; m0=$(mt); c0=$(ct); "$@" > $D/out.json 2>$D/err.txt
  echo "$l: rc=$? minio $(( $(mt)-m0 )) ticks, gpucr $(( $(ct)-c0 )) ticks"; phases $D/out.json; }
for k in 1 2 3; do
  P=$(start); run "ckpt-local $k" ./gpucr checkpoint $P -D $D/c --json; rm -rf $D/c
  order="old new"; [ $k = 2 ] && order="new old"
  for g in $order; do
    G=./gpucr; [ $g = old ] && G=./gpucr-old
    prof=(); [ $g = new ] && [ $k = 3 ] && prof=(--cpu-profile $OUT/ckpt-to-new.prof)
    P=$(start); run "ckpt-to $g $k" $G checkpoint $P --to s3://e4b/$g$k/h --json "${prof[@]}"
    [ $g = new ] && [ $k = 3 ] && { run "rst-from new" ./gpucr restore --from s3://e4b/$g$k/h --json; verify_kill $(sed -n 's/^ *"rootPid": *\([0-9]*\).*/\1/p' $D/out.json | head -1); }
    ./gpucr rm s3://e4b/$g$k/h >/dev/null 2>&1 || echo "rm $g$k failed"
  done
done
pkill -9 -f "[h]older.py"; rm -rf $D
echo "(ticks: 1/100 s of CPU)"
