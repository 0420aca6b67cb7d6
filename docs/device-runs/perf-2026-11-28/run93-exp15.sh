#!/usr/bin/env bash
# Device run 93: is a local checkpoint's driver staging slowed by the reserve (fallocate of
# the image's memory files in /dev/shm meanwhile) when the host's memory has been used, as
# in run 92 (local gpu-checkpoint 7.7-9.9 s against 5.9-6.9 s for checkpoints --to beside
# them)? One binary (38f94a5 plus an AB_NORESERVE switch), 16 GiB holders, reserve on and off
# alternating, 4 each, no cache dropping; first 48 GiB written to /dev/shm and removed, as a
# host whose memory was used; /proc/vmstat's compaction and THP counters over each checkpoint.
set -u
if [ -z "${REAPED:-}" ]; then
  mkdir -p bundle && tar -xJf storebench/bundle.tar.xz -C bundle && xz -dc storebench/gpucr-ab.xz > bundle/gpucr-ab && chmod +x bundle/gpucr-ab
  exec env REAPED=1 python3 bundle/subreaper.py bash "$0"
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
cd bundle; B=$PWD; export GPUCR_CRIU=$B/criu/criu
pkill -9 -f "[h]older.py"; sleep 1; D=/dev/shm/e15-$$; rm -rf $D; mkdir -p $D/w
grep -E "MemFree|MemAvailable|Shmem:" /proc/meminfo | tr -s ' ' | tr '\n' ' '; echo
for i in $(seq 48); do head -c 1G /dev/zero > $D/fill$i 2>/dev/null || break; done; rm -f $D/fill*
grep -E "MemFree|MemAvailable|Shmem:" /proc/meminfo | tr -s ' ' | tr '\n' ' '; echo
vm() { awk '/^(compact_stall|compact_fail|compact_success|thp_fault_alloc|thp_fault_fallback|thp_collapse_alloc) /{printf "%s=%s ",$1,$2}' /proc/vmstat; }
vmd() { python3 -c "
import sys; a=dict(x.split('=') for x in sys.argv[1].split()); b=dict(x.split('=') for x in sys.argv[2].split())
print('  vmstat', ' '.join('%s+%d'%(k,int(b[k])-int(a[k])) for k in a))" "$1" "$2"; }
ct() { awk '{print $16+$17}' /proc/$$/stat; }
start() { rm -rf $D/w; mkdir -p $D/w; setsid python3 holder.py 16 $D/w </dev/null >/dev/null 2>$D/w/err & disown
  local i; for i in $(seq 600); do [ -s $D/w/ready ] && break; sleep 0.1; done; cut -d' ' -f1 $D/w/ready; }
phases() { python3 -c "
import json,sys; t=open(sys.argv[1]).read(); d=json.loads(t[t.index('{'):])
if 'totalSeconds' not in d: print(t[-400:]); sys.exit()
print('  total=%.2f'%d['totalSeconds'], ' '.join('%s=%.2f'%(p['name'],p['seconds']) for p in d['phases']))" $1; }
run() { local c0 v0 l=$1; shift; c0=$(ct); v0=$(vm); "$@" > $D/out.json 2>$D/err.txt
  echo "$l: rc=$? gpucr $(( $(ct)-c0 )) ticks"; phases $D/out.json; vmd "$v0" "$(vm)"; }
for k in 1 2 3 4; do
  order="on off"; [ $((k % 2)) = 0 ] && order="off on"
  for m in $order; do
    P=$(start)
    if [ $m = off ]; then run "reserve-off $k" env AB_NORESERVE=1 ./gpucr-ab checkpoint $P -D $D/c --json
    else run "reserve-on $k" ./gpucr-ab checkpoint $P -D $D/c --json; fi
    rm -rf $D/c; pkill -9 -f "[h]older.py"; sleep 1
  done
done
rm -rf $D
