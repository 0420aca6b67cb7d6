#!/usr/bin/env bash
# Installs what gpucr needs on Debian bookworm: build tools, runc and crun from apt, and CRIU >= 4.1.
# CRIU: the system's criu if new enough, otherwise CRIU built from Debian's next release's
# source package into $GPUCR_CRIU_PREFIX (default /opt/gpucr/criu), where gpucr looks for it.
# Idempotent: each step is skipped when its result is already there.
set -euo pipefail

PREFIX=${GPUCR_CRIU_PREFIX:-/opt/gpucr/criu}
CRIU_VERSION=4.1.1
NEXT_RELEASE=${GPUCR_CRIU_SUITE:-trixie}
WORK=${GPUCR_BUILD_CACHE:-/var/cache/gpucr-build}
mkdir -p "$WORK"

log() { printf 'install-deps: %s\n' "$*" >&2; }
die() { printf 'install-deps: error: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "must run as root (apt-get and CRIU need it)"
command -v apt-get >/dev/null || die "apt-get not found: this script supports Debian bookworm"

BUILD_DEPS=(build-essential pkg-config git ca-certificates xz-utils
  libprotobuf-c-dev protobuf-c-compiler libprotobuf-dev protobuf-compiler python3-protobuf
  libnl-3-dev libnet1-dev libcap-dev libbsd-dev libgnutls28-dev libnftables-dev libaio-dev
  uuid-dev libdrm-dev iproute2 busybox-static patch runc crun nftables)

missing=()
for p in "${BUILD_DEPS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Tests check that gpucr refuses a CRIU older than 4.1 with a real one: bookworm's own
# criu package, unpacked into the cache, never installed.
old=$WORK/old-criu
if [ ! -x "$old/usr/sbin/criu" ]; then
  mkdir -p "$old"
  (cd "$old" && apt-get download -qq criu 2>/dev/null && dpkg -x criu_*.deb . && rm -f criu_*.deb) ||
    log "could not fetch bookworm's criu for the old-CRIU test"
fi

# version_ok PATH: true when PATH is a criu of at least 4.1.
version_ok() {
  local v
  v=$("$1" --version 2>/dev/null | sed -n 's/^Version: *//p' | head -1) || return 1
  [ -n "$v" ] || return 1
  [ "$(printf '%s\n4.1\n' "$v" | sort -V | head -1)" = 4.1 ]
}

if command -v criu >/dev/null && version_ok "$(command -v criu)"; then
  log "system criu is new enough: $(command -v criu)"
  exit 0
fi
# gpucr's own fixes to CRIU (scripts/criu-patches) and its CRIU plugin for the NVIDIA device
# files of processes without CUDA state; a change to either rebuilds them.
patches=$(cd "$(dirname "$0")" && pwd)/criu-patches
nvplugin=$(cd "$(dirname "$0")/.." && pwd)/internal/gpu/nvidia/criuplugin/gpucr_nvidia.c
stamp=$(cat "$patches"/*.patch "$nvplugin" | sha256sum | cut -c1-16)
if [ -x "$PREFIX/sbin/criu" ] && version_ok "$PREFIX/sbin/criu" && [ -f "$PREFIX/lib/amdgpu/amdgpu_plugin.so" ] &&
  [ -f "$PREFIX/lib/nvidia/gpucr_nvidia.so" ] &&
  [ "$(cat "$PREFIX/PATCHES" 2>/dev/null)" = "$stamp" ]; then
  log "criu $CRIU_VERSION already built: $PREFIX/sbin/criu"
  exit 0
fi

# A deb-src entry for the next Debian release, made from this machine's own apt sources so
# that no mirror is named here; kept in its own lists directory so the system's lists stay as they are.
mkdir -p "$WORK/lists/partial"
uri=$(grep -hE '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}' | grep -v security | head -1 || true)
if [ -z "$uri" ]; then
  uri=$(grep -hE '^deb ' /etc/apt/sources.list 2>/dev/null | grep -v security | awk '{print $2}' | head -1 || true)
fi
[ -n "$uri" ] || die "cannot find a Debian mirror in this machine's apt sources"
cat > "$WORK/src.sources" <<SRC
Types: deb-src
URIs: $uri
Suites: $NEXT_RELEASE
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
APT_OPTS=(-o "Dir::Etc::SourceList=$WORK/src.sources" -o "Dir::Etc::SourceParts=-"
  -o "Dir::State::Lists=$WORK/lists" -o "APT::Sandbox::User=root")

tarball=$WORK/criu_$CRIU_VERSION.orig.tar
if [ ! -s "$tarball" ]; then
  log "fetching the criu source list for $NEXT_RELEASE"
  apt-get "${APT_OPTS[@]}" update -qq
  line=$(cd "$WORK" && apt-get "${APT_OPTS[@]}" --print-uris source criu 2>/dev/null | grep "criu_${CRIU_VERSION}.orig.tar" | head -1) ||
    die "criu $CRIU_VERSION source not found for $NEXT_RELEASE"
  [ -n "$line" ] || die "criu $CRIU_VERSION source not found for $NEXT_RELEASE"
  src_uri=$(echo "$line" | awk '{print $1}' | tr -d "'")
  sum=$(echo "$line" | awk '{print $4}')
  log "downloading the criu $CRIU_VERSION source (hash checked)"
  /usr/lib/apt/apt-helper -o APT::Sandbox::User=root download-file "$src_uri" "$tarball.part" "$sum" >/dev/null
  mv "$tarball.part" "$tarball"
fi

srcdir=$WORK/criu-$CRIU_VERSION
if [ ! -x "$srcdir/criu/criu" ] || [ ! -f "$srcdir/plugins/amdgpu/amdgpu_plugin.so" ] ||
  [ "$(cat "$srcdir/.gpucr-patches" 2>/dev/null)" != "$stamp" ]; then
  rm -rf "$srcdir"; mkdir -p "$srcdir"
  tar -xf "$tarball" -C "$srcdir" --strip-components=1
  for p in "$patches"/*.patch; do
    patch -d "$srcdir" -p1 --quiet < "$p" || die "patch $(basename "$p") does not apply"
  done
  echo "$stamp" > "$srcdir/.gpucr-patches"
  log "building criu $CRIU_VERSION (about half a minute on 2 cores)"
  make -C "$srcdir" -j"$(nproc)" criu amdgpu_plugin >"$WORK/build.log" 2>&1 || { tail -20 "$WORK/build.log" >&2; die "criu build failed; full log: $WORK/build.log"; }
fi
# -iquote: CRIU's include directory has headers named as the C library's.
gcc -Wall -Werror -O2 -shared -fPIC -iquote "$srcdir/criu/include" -o "$WORK/gpucr_nvidia.so" "$nvplugin" ||
  die "gpucr's NVIDIA CRIU plugin did not build"
install -D -m 0755 "$srcdir/criu/criu" "$PREFIX/sbin/criu"
# The amdgpu plugin stays out of CRIU's default plugin directory: gpucr points CRIU at it
# (CRIU_LIBS_DIR) only for processes and images with AMD GPU state.
install -D -m 0644 "$srcdir/plugins/amdgpu/amdgpu_plugin.so" "$PREFIX/lib/amdgpu/amdgpu_plugin.so"
# gpucr's NVIDIA plugin likewise, for trees with processes that inherited NVIDIA device files.
install -D -m 0644 "$WORK/gpucr_nvidia.so" "$PREFIX/lib/nvidia/gpucr_nvidia.so"
echo "$stamp" > "$PREFIX/PATCHES"
version_ok "$PREFIX/sbin/criu" || die "built criu does not report version >= 4.1"
log "installed $PREFIX/sbin/criu"
