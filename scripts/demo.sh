#!/usr/bin/env bash
# The demo: start a process that counts, checkpoint it (which stops it), show that it is
# gone, restore it and show it counting on from where it was.
set -euo pipefail
cd "$(dirname "$0")/.."
GPUCR=${GPUCR:-bin/gpucr}
work=$(mktemp -d /tmp/gpucr-demo.XXXXXX)
img=$work/image
trap 'kill -9 "${pid:-0}" 2>/dev/null || true' EXIT

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
# The counter pads its files to a fixed width.
count() { tr -d ' \n' < "$work/count"; }

"$GPUCR" check
say "starting a counter that holds 256 MiB of patterned memory"
setsid bin/counter -dir "$work" -mib 256 </dev/null >/dev/null 2>&1 &
pid=$!
sleep 1.5
echo "PID $pid counts: $(count)"
sleep 0.5
echo "PID $pid counts: $(count)"

say "checkpoint (the process is stopped once its image is safe)"
"$GPUCR" checkpoint "$pid" -D "$img"
at=$(count)
sleep 0.5
if kill -0 "$pid" 2>/dev/null && ! grep -q ') Z ' "/proc/$pid/stat"; then echo "unexpected: $pid still runs"; exit 1; fi
echo "PID $pid is gone; its count stopped at $at"

say "inspect and verify the image"
"$GPUCR" inspect "$img"
"$GPUCR" verify "$img"

say "restore"
"$GPUCR" restore -D "$img"
sleep 1
now=$(count)
echo "PID $pid counts again: $now (it stopped at $at)"
kill -USR1 "$pid"; sleep 0.5
echo "memory check after restore: $(tr -s ' ' < "$work/verify")"
[ "$now" -gt "$at" ] && grep -q '^ok' "$work/verify"
say "demo done: the restored process went on from $at with its memory intact"
