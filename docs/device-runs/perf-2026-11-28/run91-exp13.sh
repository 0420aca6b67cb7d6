#!/usr/bin/env bash
# Device run 91: does the reserve (fallocate of the image's memory files on /dev/shm while
# the driver stages) slow the driver's staging? One binary (38f94a5 plus an AB_NORESERVE
# switch), 16 GiB holders, local checkpoints to /dev/shm, reserve on and off alternating,
# 4 each, each checkpoint's phases and gpucr's CPU ticks.
set -u
if [ -z "${REAPED:-}" ]; then
  mkdir -p bundle && tar -xJf storebench/bundle.tar.xz -C bundle && xz -dc storebench/gpucr-ab.xz > bundle/gpucr-ab && chmod +x bundle/gpucr-ab
  exec env REAPED=1 python3 bundle/subreaper.py bash "$0"
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
cd bundle; B=$PWD; export GPUCR_CRIU=$B/criu/criu
pkill -9 -f "[h]older.py"; sleep 1; D=/dev/shm/e13-$$; rm -rf $D; mkdir -p $D/w
ct() { awk '{print $16+$17}' /proc/$$/stat; }
start() { rm -rf $D/w; mkdir -p $D/w; setsid python3 holder.py 16 $D/w </dev/null >/dev/null 2>$D/w/err & disown
  local i; for i in $(seq 600); do [ -s $D/w/ready ] && break; sleep 0.1; done; cut -d' ' -f1 $D/w/ready; }
phases() { python3 -c "
import json,sys; t=open(sys.argv[1]).read(); d=json.loads(t[t.index('{'):])
if 'totalSeconds' not in d: print(t[-400:]); sys.exit()
print('  total=%.2f'%d['totalSeconds'], ' '.join('%s=%.2f'%(p['name'],p['seconds']) for p in d['phases']))" $1; }
run() { local c0 l=$1; shift; c0=$(ct); "$@" > $D/out.json 2>$D/err.txt
  echo "$l: rc=$? gpucr $(( $(ct)-c0 )) ticks"; phases $D/out.json; }
for k in 1 2 3 4; do
  for m in on off; do
    [ $k = 2 -o $k = 4 ] && { [ $m = on ] && m=off || m=on; }
    P=$(start); sync; echo 3 > /proc/sys/vm/drop_caches
    if [ $m = off ]; then run "reserve-off $k" env AB_NORESERVE=1 ./gpucr-ab checkpoint $P -D $D/c --json
    else run "reserve-on $k" ./gpucr-ab checkpoint $P -D $D/c --json; fi
    rm -rf $D/c; pkill -9 -f "[h]older.py"; sleep 1
  done
done
rm -rf $D
