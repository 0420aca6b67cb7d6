#!/usr/bin/env bash
# Device run 70: are the runs gpucr fills backed by huge pages? A 16 GiB holder checkpointed
# locally and restored twice, the restored PID's AnonHugePages and Rss sampled every 20 ms
# while the restore runs (the restore keeps the PID), plus the host's THP settings.
set -u
if [ -z "${REAPED:-}" ]; then
  mkdir -p bundle && tar -xJf storebench/bundle.tar.xz -C bundle
  exec env REAPED=1 python3 bundle/subreaper.py bash "$0"
fi
cd bundle; export GPUCR_CRIU=$PWD/criu/criu
pkill -9 -f "[h]older.py"; D=/dev/shm/e10-$$; rm -rf $D; mkdir -p $D/w
echo "THP enabled: $(cat /sys/kernel/mm/transparent_hugepage/enabled); defrag: $(cat /sys/kernel/mm/transparent_hugepage/defrag)"
setsid python3 holder.py 16 $D/w </dev/null >/dev/null 2>$D/w/err & disown
for i in $(seq 600); do [ -s $D/w/ready ] && break; sleep 0.1; done; P=$(cut -d' ' -f1 $D/w/ready)
echo "holder $P before: $(grep -E 'AnonHugePages|^Rss' /proc/$P/smaps_rollup | tr -s ' ' | tr '\n' ' ')"
sample() { local most=0 rss=0; while [ ! -e $D/stop ]; do
    a=$(awk '/AnonHugePages/{print $2}' /proc/$P/smaps_rollup 2>/dev/null); r=$(awk '/^Rss/{print $2}' /proc/$P/smaps_rollup 2>/dev/null)
    [ -n "$a" ] && [ "$a" -gt "$most" ] && most=$a; [ -n "$r" ] && [ "$r" -gt "$rss" ] && rss=$r; sleep 0.02; done
  echo "  most AnonHugePages ${most} kB, most Rss ${rss} kB"; }
rm -f $D/stop; sample & S=$!
./gpucr checkpoint $P -D $D/img --json > $D/c.json 2>&1; touch $D/stop; wait $S
python3 -c "import json;d=json.load(open('$D/c.json'));print('checkpoint', d['totalSeconds'], [(p['name'],round(p['seconds'],2)) for p in d['phases']])"
for k in 1 2; do
  rm -f $D/stop; sample & S=$!
  ./gpucr restore -D $D/img --json > $D/r.json 2>&1
  sleep 0.3; touch $D/stop; wait $S
  python3 -c "import json;d=json.load(open('$D/r.json'));print('restore', d['totalSeconds'], [(p['name'],round(p['seconds'],2)) for p in d['phases']])"
  echo "  after: $(grep -E 'AnonHugePages|^Rss' /proc/$P/smaps_rollup | tr -s ' ' | tr '\n' ' ')"
  touch $D/w/verify; for i in $(seq 600); do r=$(cat $D/w/result* 2>/dev/null); [ -n "$r" ] && break; sleep 0.1; done
  echo "  verified: $r"; rm -f $D/w/result*; kill -9 $P; for i in $(seq 200); do [ -e /proc/$P ] || break; sleep 0.05; done
done
rm -rf $D
