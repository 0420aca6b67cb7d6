#!/usr/bin/env bash
# Builds engines/: the container engines for test/gpu/engines_plan.sh, taken from this Debian
# bookworm machine's own package sources (apt-get download, dpkg -x; nothing is installed
# here): podman 4.3.1 with conmon, catatonit and its configuration files, and containerd
# 1.6.20 with ctr and containerd-shim-runc-v2, plus every shared library they load beyond
# glibc. The GPU machine (Ubuntu 24.04, newer glibc) lacks podman and containerd and may
# lack any of those libraries (libgpgme, libassuan, libsubid are not on this machine
# either), so podman and conmon get an RPATH of $ORIGIN/../lib (patchelf, unpacked here
# too): they, and what podman starts again (its cleanup command), load the carried
# libraries wherever the prefix is unpacked, with no loader configuration on the host.
# containerd, ctr and the shim need glibc alone. Also iptables-restore (iptables-nft, with
# its extensions): CRIU locks a container's own network namespace with it, runc 1.1 asking
# for no other method. And ip (iproute2): CRIU saves a container's own network namespace's
# addresses and routes with it, which the GPU machine lacks. runc and CRIU come from bundle/.
#
# engines/engines.tar.xz and engines/bundle.tar.xz (bundle/, stripped) are what is carried,
# the device unpacking the bundle first: mkdir -p bundle && tar -xJf engines/bundle.tar.xz
# -C bundle && cd bundle && bash engines_plan.sh; engines/MANIFEST lists versions, sizes and the
# libraries, with what ldd said of each binary.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/txz.sh
out=engines
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Engines, then the libraries they need that a host may lack; ldd below checks that
# nothing is left unresolved.
PKGS=(podman conmon catatonit golang-github-containers-common golang-github-containers-image containerd
  libgpgme11 libassuan0 libsubid4 iptables libxtables12 iproute2 patchelf)
(cd "$work" && apt-get download -qq "${PKGS[@]}" 2>/dev/null) ||
  { echo "bundle-engines: apt-get download ${PKGS[*]} failed (run apt-get update?)" >&2; exit 1; }
mkdir -p "$work/x"
for d in "$work"/*.deb; do dpkg -x "$d" "$work/x"; done
rm "$work"/patchelf_*.deb # a build tool, not carried
x=$work/x
p=$work/prefix
mkdir -p "$p/bin" "$p/lib" "$p/etc/containers" "$p/share/containers"
for b in podman conmon catatonit containerd ctr containerd-shim-runc-v2; do cp "$x/usr/bin/$b" "$p/bin/"; done
cp "$x/usr/sbin/xtables-nft-multi" "$x/bin/ip" "$p/bin/"
cp -r "$x/usr/lib/x86_64-linux-gnu/xtables" "$p/lib/"
# CRIU runs iptables-restore and ip6tables-restore from PATH; the multi-binary acts on its
# name, and finds its extensions through XTABLES_LIBDIR.
for n in iptables-restore ip6tables-restore; do
  cat > "$p/bin/$n" <<'SH'
#!/bin/bash
here=$(dirname "$(readlink -f "$0")")
XTABLES_LIBDIR=$here/../lib/xtables exec -a "$(basename "$0")" "$here/xtables-nft-multi" "$@"
SH
  chmod +x "$p/bin/$n"
done
cp "$x/usr/share/containers/seccomp.json" "$p/share/containers/"
cp "$x/etc/containers/policy.json" "$p/etc/containers/"

# Every library beyond glibc's own that a binary loads, resolved against the unpacked
# packages first, then this host.
libdirs=$x/usr/lib/x86_64-linux-gnu:$x/lib/x86_64-linux-gnu
{
  echo "# engines/ built $(date -u +%F) on $(. /etc/os-release && echo "$PRETTY_NAME")"
  for d in "$work"/*.deb; do dpkg-deb -f "$d" Package Version | paste -sd' '; done
  echo
  for b in "$p"/bin/*; do
    [ "$(head -c2 "$b")" = "#!" ] && continue
    echo "== ldd $(basename "$b")"
    LD_LIBRARY_PATH=$libdirs ldd "$b" 2>&1 || true
  done
} > "$work/MANIFEST"
if grep -q "not found" "$work/MANIFEST"; then
  grep -B30 "not found" "$work/MANIFEST" >&2
  echo "bundle-engines: a library above is in no package listed in PKGS: add its package" >&2
  exit 1
fi
awk '/=> \//{print $3}' "$work/MANIFEST" | sort -u |
  grep -vE '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*)\.so' |
  while read -r lib; do cp -L "$lib" "$p/lib/"; done
"$x/usr/bin/patchelf" --force-rpath --set-rpath '$ORIGIN/../lib' "$p/bin/podman" "$p/bin/conmon" "$p/bin/xtables-nft-multi" "$p/bin/ip"
# What the GPU machine will load: the carried libraries, or glibc's own from its host.
for b in "$p"/bin/*; do
  [ "$(head -c2 "$b")" = "#!" ] && continue
  env -u LD_LIBRARY_PATH ldd "$b" 2>&1 | grep -E "=>" | grep -vE "=> $p/bin/../lib/|/(libc|libm|libdl|libpthread|librt)\.so" &&
    { echo "bundle-engines: $(basename "$b") loads a library above from outside the bundle" >&2; exit 1; }
done

# crun with CRIU: bookworm's crun 1.8.1 is built without it, and crun hands CRIU the
# integration's configuration file only from crun 1.26 with CRIU 4.2 (docs/containers.md).
# So crun/ holds the next Debian's crun, CRIU and libcriu (built for a newer glibc: they run
# on the GPU machine's Ubuntu 24.04, not here), fetched from this machine's own mirror, with
# the libraries those packages add in crun/lib; crun/fallback has bookworm's copies of the
# common ones a host may lack, used only when the host's own are missing.
uri=$(grep -hE '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}' | grep -v security | head -1 || true)
[ -n "$uri" ] || uri=$(grep -hE '^deb ' /etc/apt/sources.list 2>/dev/null | grep -v security | awk '{print $2}' | head -1 || true)
[ -n "$uri" ] || { echo "bundle-engines: no Debian mirror in this machine's apt sources" >&2; exit 1; }
next=$work/next; mkdir -p "$next/lists/partial" "$next/cache/archives/partial" "$next/deb" "$next/x"
printf 'Types: deb\nURIs: %s\nSuites: %s\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
  "$uri" "${GPUCR_CRUN_SUITE:-sid}" > "$next/next.sources"
apt_next=(-o "Dir::Etc::SourceList=$next/next.sources" -o "Dir::Etc::SourceParts=-" -o "Dir::State::Lists=$next/lists"
  -o "Dir::Cache=$next/cache" -o "APT::Sandbox::User=root")
apt-get "${apt_next[@]}" update -qq
(cd "$next/deb" && apt-get "${apt_next[@]}" download -qq crun criu libcriu2 libcompel1 libblake3-0 libnet9 libnl-3-200) ||
  { echo "bundle-engines: fetching crun and CRIU from ${GPUCR_CRUN_SUITE:-sid} failed" >&2; exit 1; }
for d in "$next/deb"/*.deb; do dpkg -x "$d" "$next/x"; done
c=$p/crun; mkdir -p "$c/lib" "$c/fallback"
cp "$next/x/usr/bin/crun" "$c/crun.bin"; cp "$next/x/usr/sbin/criu" "$c/criu.bin"
cp -a "$next/x/usr/lib/x86_64-linux-gnu/"lib*.so.* "$c/lib/"
(cd "$work" && apt-get download -qq libprotobuf-c1 libnftables1 libmnl0 libnftnl11 libjansson4 libjson-c5 libbsd0 libmd0 libxtables12 libgmp10) ||
  { echo "bundle-engines: apt-get download of crun's fallback libraries failed" >&2; exit 1; }
for d in libprotobuf-c1 libnftables1 libmnl0 libnftnl11 libjansson4 libjson-c5 libbsd0 libmd0 libxtables12 libgmp10; do
  dpkg -x "$work/${d}"_*.deb "$work/fb"; done
for d in "$work/fb/usr/lib/x86_64-linux-gnu" "$work/fb/lib/x86_64-linux-gnu"; do
  [ -d "$d" ] && cp -a "$d"/lib*.so.* "$c/fallback/"
done
for n in crun criu; do
  cat > "$c/$n" <<SH
#!/bin/bash
# $n from the next Debian release, with the libraries its packages add; bookworm's copies of
# common ones only where this host lacks them. crun's libcriu starts the criu found on PATH.
here=\$(dirname "\$(readlink -f "\$0")")
export LD_LIBRARY_PATH=\$here/lib PATH=\$here:\$PATH
LD_LIBRARY_PATH=\$here/lib ldd "\$here/$n.bin" 2>/dev/null | grep -q "not found" && LD_LIBRARY_PATH=\$here/lib:\$here/fallback
exec "\$here/$n.bin" "\$@"
SH
  chmod +x "$c/$n"
done
for d in "$next/deb"/*.deb; do dpkg-deb -f "$d" Package Version | paste -sd' '; done > "$work/crun-versions"

rm -rf "$out"; mkdir -p "$out"
txz "$p" "$out/engines.tar.xz"
bundle_txz "$out/bundle.tar.xz" # carried beside it: engines/ is the one folder a device run needs
{
  cat "$work/MANIFEST"
  echo
  echo "== crun/ (from ${GPUCR_CRUN_SUITE:-sid}: for the GPU machine's newer glibc)"
  cat "$work/crun-versions"
  echo
  echo "== carried libraries (podman, conmon and iptables load these through their RPATH)"
  (cd "$p/lib" && ls -1 | grep -v '^xtables$')
  echo
  echo "== sizes"
  du -sh "$p" | sed 's/\t.*/ unpacked/'
  du -sh "$out/engines.tar.xz"
} > "$out/MANIFEST"
grep -A100 '^== carried' "$out/MANIFEST"
