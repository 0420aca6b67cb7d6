# What a child forked after CUDA started holds, and what plain CRIU makes of it (device run 122).
# Run from the bundle directory: PROBE=DIR-OF-THIS python3 subreaper.py bash $PROBE/probe.sh
set -x
PROBE=${PROBE:?}
B=$PWD
python3 $PROBE/probe_fork.py > /tmp/pf.out 2>&1 &
for i in $(seq 100); do grep -q READY /tmp/pf.out && break; sleep 0.2; done
cat /tmp/pf.out
P=$(grep READY /tmp/pf.out | cut -d' ' -f2); C=$(grep READY /tmp/pf.out | cut -d' ' -f3)
./gpucr checkpoint $P -D /dev/shm/pimg --dry-run 2>&1 | tail -5
python3 $PROBE/cuckpt.py ckpt $P
echo "child after parent's checkpoint:"; ls -l /proc/$C/fd | grep nvidia | wc -l; grep -c nvidia /proc/$C/maps; grep nvidia /proc/$C/maps | head -5
echo "parent:"; ls -l /proc/$P/fd | grep -c nvidia; grep -c nvidia /proc/$P/maps
mkdir -p /dev/shm/crimg
./criu/criu dump -t $P -D /dev/shm/crimg --shell-job --leave-running -v4 -o dump.log --ext-unix-sk; echo "criu rc $?"
grep -E 'Error|rror \(|nvidia' /dev/shm/crimg/dump.log | head -20
python3 $PROBE/cuckpt.py rst $P
kill -9 $P $C
