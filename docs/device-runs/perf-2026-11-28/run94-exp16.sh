#!/usr/bin/env bash
# Device run 94: what bounds checkpoint --to's memory save against MinIO (--no-compat,
# /dev/shm)? This build (0fa3f80) with the stream's upload workers set by AB_WORKERS: 16 (the
# default, one per core), 32 and 48, alternating, 2 each, 16 GiB holders; gpucr's, MinIO's and
# the whole machine's idle CPU ticks over each checkpoint.
set -u
if [ -z "${REAPED:-}" ]; then
  mkdir -p bundle && tar -xJf storebench/bundle.tar.xz -C bundle && xz -dc storebench/minio.xz > bundle/minio && chmod +x bundle/minio
  xz -dc storebench/gpucr-ab.xz > bundle/gpucr-ab && chmod +x bundle/gpucr-ab
  exec env REAPED=1 python3 bundle/subreaper.py bash "$0"
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
cd bundle; B=$PWD; export GPUCR_CRIU=$B/criu/criu
pkill -f "[m]inio server"; pkill -9 -f "[h]older.py"; sleep 1; D=/dev/shm/e16-$$; rm -rf $D; mkdir -p $D/minio/e4b $D/w
MINIO_ROOT_USER=e4user MINIO_ROOT_PASSWORD=e4secret123 setsid ./minio server --quiet --address 127.0.0.1:9400 --console-address 127.0.0.1:9401 --no-compat $D/minio </dev/null >$D/minio.log 2>&1 &
MP=$!; trap "kill $MP" EXIT
export GPUCR_S3_ENDPOINT=http://127.0.0.1:9400 AWS_ACCESS_KEY_ID=e4user AWS_SECRET_ACCESS_KEY=e4secret123 AWS_REGION=us-east-1
for i in $(seq 100); do ./gpucr ls s3://e4b >/dev/null 2>&1 && break; sleep 0.3; done
mt() { awk '{print $14+$15}' /proc/$MP/stat; }
ct() { awk '{print $16+$17}' /proc/$$/stat; }
idle() { awk '/^cpu /{print $5+$6}' /proc/stat; }
start() { rm -rf $D/w; mkdir -p $D/w; setsid python3 holder.py 16 $D/w </dev/null >/dev/null 2>$D/w/err & disown
  local i; for i in $(seq 600); do [ -s $D/w/ready ] && break; sleep 0.1; done; cut -d' ' -f1 $D/w/ready; }
phases() { python3 -c "
import json,sys; t=open(sys.argv[1]).read(); d=json.loads(t[t.index('{'):])
if 'totalSeconds' not in d: print(t[-400:]); sys.exit()
print('  total=%.2f'%d['totalSeconds'], ' '.join('%s=%.2f'%(p['name'],p['seconds']) for p in d['phases']))" $1; }
run() { local m0 c0 i0 l=$1; shift; m0=$(mt); c0=$(ct); i0=$(idle); "$@" > $D/out.json 2>$D/err.txt
  echo "$l: rc=$? minio $(( $(mt)-m0 )) ticks, gpucr $(( $(ct)-c0 )) ticks, machine idle $(( $(idle)-i0 )) ticks"; phases $D/out.json; }
for k in 1 2; do
  order="16 32 48"; [ $k = 2 ] && order="48 32 16"
  for w in $order; do
    P=$(start); run "ckpt-to workers=$w $k" env AB_WORKERS=$w ./gpucr-ab checkpoint $P --to s3://e4b/w$w-$k/h --json
    ./gpucr-ab rm s3://e4b/w$w-$k/h >/dev/null 2>&1 || echo "rm failed"
  done
done
pkill -9 -f "[h]older.py"; rm -rf $D
echo "(ticks: 1/100 s of CPU; 16 cores)"
