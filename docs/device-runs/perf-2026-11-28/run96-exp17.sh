#!/usr/bin/env bash
# Device run 96: this session's last code against MinIO (--no-compat, /dev/shm), 16 GiB
# holders, 2 rounds: a local checkpoint (--leave-running) and a checkpoint --to of the same
# holder; then a local restore and a restore --from, each verified by the holder.
set -u
if [ -z "${REAPED:-}" ]; then
  [ -d bundle ] || { mkdir -p bundle && tar -xJf storebench/bundle.tar.xz -C bundle; }
  xz -dc storebench/minio.xz > bundle/minio && chmod +x bundle/minio
  exec env REAPED=1 python3 bundle/subreaper.py bash "$0"
fi
cd bundle; B=$PWD; export GPUCR_CRIU=$B/criu/criu
pkill -f "[m]inio server"; pkill -9 -f "[h]older.py"; sleep 1; D=/dev/shm/e17-$$; rm -rf $D; mkdir -p $D/minio/e4b $D/w
MINIO_ROOT_USER=e4user MINIO_ROOT_PASSWORD=e4secret123 setsid ./minio server --quiet --address 127.0.0.1:9400 --console-address 127.0.0.1:9401 --no-compat $D/minio </dev/null >$D/minio.log 2>&1 &
MP=$!; trap "kill $MP" EXIT
export GPUCR_S3_ENDPOINT=http://127.0.0.1:9400 AWS_ACCESS_KEY_ID=e4user AWS_SECRET_ACCESS_KEY=e4secret123 AWS_REGION=us-east-1
for i in $(seq 100); do ./gpucr ls s3://e4b >/dev/null 2>&1 && break; sleep 0.3; done
start() { rm -rf $D/w; mkdir -p $D/w; setsid python3 holder.py 16 $D/w </dev/null >/dev/null 2>$D/w/err & disown
  local i; for i in $(seq 600); do [ -s $D/w/ready ] && break; sleep 0.1; done; cut -d' ' -f1 $D/w/ready; }
verify_kill() { [ -n "${1:-}" ] || { echo "  no restored pid"; return; }
  local i r; touch $D/w/verify; for i in $(seq 600); do r=$(cat $D/w/result* 2>/dev/null); [ -n "$r" ] && break; sleep 0.1; done
  echo "  verified: $r"; rm -f $D/w/result*; kill -9 $1; for i in $(seq 200); do [ -e /proc/$1 ] || break; sleep 0.05; done; }
phases() { python3 -c "
import json,sys; t=open(sys.argv[1]).read(); d=json.loads(t[t.index('{'):])
if 'totalSeconds' not in d: print(t[-400:]); sys.exit()
print('  total=%.2f'%d['totalSeconds'], ' '.join('%s=%.2f'%(p['name'],p['seconds']) for p in d['phases']))" $1; }
run() { local l=$1; shift; "$@" > $D/out.json 2>$D/err.txt; echo "$l: rc=$?"; phases $D/out.json; }
rpid() { sed -n 's/^ *"rootPid": *\([0-9]*\).*/\1/p' $D/out.json | head -1; }
for k in 1 2; do
  P=$(start); run "ckpt-local $k" ./gpucr checkpoint $P -D $D/img$k --leave-running --json
  run "ckpt-to $k" ./gpucr checkpoint $P --to s3://e4b/r$k/h --json
  run "rst-local $k" ./gpucr restore -D $D/img$k --json; verify_kill $(rpid)
  run "rst-from $k" ./gpucr restore --from s3://e4b/r$k/h --json; verify_kill $(rpid)
  rm -rf $D/img$k; ./gpucr rm s3://e4b/r$k/h >/dev/null 2>&1 || echo "rm failed"
done
pkill -9 -f "[h]older.py"; rm -rf $D
