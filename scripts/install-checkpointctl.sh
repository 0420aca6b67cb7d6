#!/usr/bin/env bash
# Builds checkpointctl, the checkpoint-restore project's tool that reads container checkpoint
# archives, which cmd/gpucr's tests run on the archives `gpucr checkpoint --export` writes.
# Built from the Go module proxy at a pinned version (1.6.0, the one Debian ships; 1.7.0
# needs a go-criu release the proxy does not serve) into $GPUCR_BUILD_CACHE/checkpointctl,
# where the tests look. Idempotent: skipped when that version is already built.
set -euo pipefail

CHECKPOINTCTL_VERSION=v1.6.0
WORK=${GPUCR_BUILD_CACHE:-/var/cache/gpucr-build}
DEST=$WORK/checkpointctl
GO=${GO:-go}

log() { printf 'install-checkpointctl: %s\n' "$*" >&2; }

if [ -x "$DEST/bin/checkpointctl" ] && [ "$(cat "$DEST/VERSION" 2>/dev/null)" = "$CHECKPOINTCTL_VERSION" ]; then
  log "checkpointctl $CHECKPOINTCTL_VERSION already built: $DEST/bin/checkpointctl"
  exit 0
fi
mkdir -p "$DEST/bin"
log "building checkpointctl $CHECKPOINTCTL_VERSION"
# GOFLAGS is cleared so that a project -mod setting does not apply to this foreign module.
GOFLAGS= CGO_ENABLED=0 GOBIN="$DEST/bin" "$GO" install "github.com/checkpoint-restore/checkpointctl@$CHECKPOINTCTL_VERSION"
echo "$CHECKPOINTCTL_VERSION" > "$DEST/VERSION"
log "built $DEST/bin/checkpointctl"
