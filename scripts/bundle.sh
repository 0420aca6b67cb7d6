#!/usr/bin/env bash
# Builds bundle/: what the GPU machine needs for the device test plans (it has no Go, no runc
# and no network): gpucr, CRIU and runc with the shared libraries they need beyond glibc,
# and the workloads.
set -euo pipefail
cd "$(dirname "$0")/.."
out=bundle
rm -rf "$out"; mkdir -p "$out/criu/lib" "$out/runc/lib"
criu=${GPUCR_CRIU:-/opt/gpucr/criu/sbin/criu}
runc=${GPUCR_RUNC:-$(command -v runc)}
cp bin/gpucr bin/counter bin/gpucr-bench "$out/"
# wrap NAME BINARY: copies BINARY to $out/NAME/NAME.bin, the libraries it needs beyond glibc
# to $out/NAME/lib, and writes $out/NAME/NAME, which runs it with those libraries.
wrap() {
  cp "$2" "$out/$1/$1.bin"
  ldd "$2" | awk '/=> \//{print $3}' | grep -vE '/(libc|libm|libdl|libpthread|ld-linux[^/]*)\.so' |
    while read -r lib; do cp -L "$lib" "$out/$1/lib/"; done
  cat > "$out/$1/$1" <<SH
#!/bin/sh
# $1 built on Debian bookworm, with its libraries beside it.
here=\$(dirname "\$(readlink -f "\$0")")
LD_LIBRARY_PATH="\$here/lib" exec "\$here/$1.bin" "\$@"
SH
  chmod +x "$out/$1/$1"
}
wrap criu "$criu"
# gpucr's NVIDIA CRIU plugin, where gpucr looks for it beside a CRIU at $out/criu/criu.
plugin=$(dirname "$(dirname "$criu")")/lib/nvidia/gpucr_nvidia.so
[ -f "$plugin" ] && install -D -m 0644 "$plugin" "$out/lib/nvidia/gpucr_nvidia.so"
wrap runc "$runc" # for the container plan (runc 1.1.5, needs libseccomp)
cp test/gpu/*.py test/gpu/*.sh "$out/"
cp scripts/bench-stream.sh scripts/subreaper.py "$out/" # the streamed image benchmark (issue 18)
du -sh "$out"
