#!/usr/bin/env bash
# Device run 90: where checkpoint --to's CPU goes now (gpucr 38f94a5). Hash and copy
# throughput of this CPU (one core, all cores); then MinIO --no-compat on /dev/shm, 16 GiB
# holders: a local checkpoint and a checkpoint --to, twice, alternating, gpucr's and MinIO's
# CPU ticks; the second --to with gpucr's CPU profile.
set -u
if [ -z "${REAPED:-}" ]; then
  mkdir -p bundle && tar -xJf storebench/bundle.tar.xz -C bundle && xz -dc storebench/minio.xz > bundle/minio && chmod +x bundle/minio
  exec env REAPED=1 python3 bundle/subreaper.py bash "$0"
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)"
GOMAXPROCS=1 ./storebench/hb.test -test.bench One -test.benchtime 1s 2>&1 | grep Bench
./storebench/hb.test -test.bench All -test.benchtime 1s 2>&1 | grep Bench
cd bundle; B=$PWD; export GPUCR_CRIU=$B/criu/criu
pkill -f "[m]inio server"; pkill -9 -f "[h]older.py"; sleep 1; D=/dev/shm/e12-$$; rm -rf $D; mkdir -p $D/minio/e4b $D/w
MINIO_ROOT_USER=e4user MINIO_ROOT_PASSWORD=e4secret123 setsid ./minio server --quiet --address 127.0.0.1:9400 --console-address 127.0.0.1:9401 --no-compat $D/minio </dev/null >$D/minio.log 2>&1 &
MP=$!; trap "kill $MP" EXIT
export GPUCR_S3_ENDPOINT=http://127.0.0.1:9400 AWS_ACCESS_KEY_ID=e4user AWS_SECRET_ACCESS_KEY=e4secret123 AWS_REGION=us-east-1
for i in $(seq 100); do ./gpucr ls s3://e4b >/dev/null 2>&1 && break; sleep 0.3; done
mt() { awk '{print $14+$15}' /proc/$MP/stat; }
ct() { awk '{print $16+$17}' /proc/$$/stat; }
start() { rm -rf $D/w; mkdir -p $D/w; setsid python3 holder.py 16 $D/w </dev/null >/dev/null 2>$D/w/err & disown
  local i; for i in $(seq 600); do [ -s $D/w/ready ] && break; sleep 0.1; done; cut -d' ' -f1 $D/w/ready; }
phases() { python3 -c "
import json,sys; t=open(sys.argv[1]).read(); d=json.loads(t[t.index('{'):])
if 'totalSeconds' not in d: print(t[-400:]); sys.exit()
print('  total=%.2f'%d['totalSeconds'], ' '.join('%s=%.2f'%(p['name'],p['seconds']) for p in d['phases']))" $1; }
run() { local m0 c0 l=$1; shift; m0=$(mt); c0=$(ct); "$@" > $D/out.json 2>$D/err.txt
  echo "$l: rc=$? minio $(( $(mt)-m0 )) ticks, gpucr $(( $(ct)-c0 )) ticks"; phases $D/out.json; }
for k in 1 2; do
  prof=(); [ $k = 2 ] && prof=(--cpu-profile $OUT/ckpt-to.prof)
  P=$(start); run "ckpt-local $k" ./gpucr checkpoint $P -D $D/c$k --json; rm -rf $D/c$k
  P=$(start); run "ckpt-to $k" ./gpucr checkpoint $P --to s3://e4b/c$k/h --json "${prof[@]}"
  ./gpucr rm s3://e4b/c$k/h >/dev/null 2>&1 || echo "rm c$k failed"
done
pkill -9 -f "[h]older.py"; rm -rf $D
echo "(ticks: 1/100 s of CPU)"
