#!/usr/bin/env bash
# Builds bundle/: what the GPU machine needs for the device test plan (it has no Go and no
# network): gpucr, CRIU with the shared libraries it needs beyond glibc, and the workloads.
set -euo pipefail
cd "$(dirname "$0")/.."
out=bundle
rm -rf "$out"; mkdir -p "$out/criu/lib"
criu=${GPUCR_CRIU:-/opt/gpucr/criu/sbin/criu}
cp bin/gpucr bin/counter bin/gpucr-bench "$out/"
cp "$criu" "$out/criu/criu.bin"
ldd "$criu" | awk '/=> \//{print $3}' | grep -vE '/(libc|libm|libdl|libpthread|ld-linux[^/]*)\.so' |
  while read -r lib; do cp -L "$lib" "$out/criu/lib/"; done
cat > "$out/criu/criu" <<'SH'
#!/bin/sh
# CRIU built on Debian bookworm, with its libraries beside it.
here=$(dirname "$(readlink -f "$0")")
LD_LIBRARY_PATH="$here/lib" exec "$here/criu.bin" "$@"
SH
chmod +x "$out/criu/criu"
cp test/gpu/*.py test/gpu/*.sh "$out/"
du -sh "$out"
