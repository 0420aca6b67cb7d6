# shellcheck shell=bash
# Sourced by the scripts that build what a device run carries (64 MiB at most in all).
# txz DIR FILE: DIR's contents as FILE, tar compressed with xz -9 on every core.
txz() { tar -C "$1" -cf - . | xz -T0 -9 > "$2"; }
# bundle_txz FILE: bundle/ (make bundle) as FILE, its Go binaries stripped. Stripping drops
# the symbol tables and DWARF only: Go's stack traces and profiles read the pclntab.
bundle_txz() {
  [ -x bundle/gpucr ] || { echo "no bundle/: run make bundle" >&2; return 1; }
  local tmp; tmp=$(mktemp -d)
  cp -a bundle "$tmp/bundle"
  strip "$tmp/bundle/gpucr" "$tmp/bundle/gpucr-bench" "$tmp/bundle/counter"
  txz "$tmp/bundle" "$1"; local rc=$?
  rm -rf "$tmp"; return $rc
}
