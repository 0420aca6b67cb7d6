#!/usr/bin/env bash
# Builds storebench/: what one device run carries to run bench-stream.sh against MinIO on
# the GPU machine (no network there, 64 MiB carried at most in all):
#   storebench/bundle.tar.xz   bundle/ (make bundle), its Go binaries stripped
#   storebench/minio.xz        the MinIO server of scripts/install-minio.sh, stripped
# The device unpacks both beside each other (docs/storage.md gives the command).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/txz.sh
out=storebench
minio=${GPUCR_MINIO:-${GPUCR_BUILD_CACHE:-/var/cache/gpucr-build}/minio/bin/minio}
[ -x "$minio" ] || { echo "bundle-storebench: no MinIO server at $minio: run scripts/install-minio.sh" >&2; exit 1; }
[ -x bundle/gpucr ] || { echo "bundle-storebench: no bundle/: run make bundle" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$out"
# The server changes only with install-minio.sh's pin; xz -9 of it takes a minute.
if [ ! "$out/minio.xz" -nt "$minio" ]; then
  strip -o "$work/minio" "$minio"
  xz -T0 -9 -c "$work/minio" > "$out/minio.xz.tmp"
  mv "$out/minio.xz.tmp" "$out/minio.xz"
fi
bundle_txz "$out/bundle.tar.xz"
total=$(du -cb "$out/minio.xz" "$out/bundle.tar.xz" | tail -1 | cut -f1)
du -h "$out/minio.xz" "$out/bundle.tar.xz"
echo "storebench/: $((total >> 20)) MiB to carry (at most 64 MiB in all)"
[ "$total" -lt $((60 << 20)) ] || { echo "bundle-storebench: over 60 MiB: trim bundle/" >&2; exit 1; }
