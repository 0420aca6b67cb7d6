#!/usr/bin/env bash
# Builds the MinIO server that internal/store's tests run on loopback, so that the S3 backend
# is tested against a real S3 implementation rather than a fake. It is built from the Go module
# proxy (MinIO no longer publishes release tags as Go versions, hence the pinned pseudo-version,
# the upstream master commit of 2026-02-12) into $GPUCR_BUILD_CACHE/minio, where the tests look.
# Idempotent: skipped when that version is already built.
set -euo pipefail

MINIO_VERSION=v0.0.0-20260212201848-7aac2a2c5b7c
WORK=${GPUCR_BUILD_CACHE:-/var/cache/gpucr-build}
DEST=$WORK/minio
GO=${GO:-go}

log() { printf 'install-minio: %s\n' "$*" >&2; }

if [ -x "$DEST/bin/minio" ] && [ "$(cat "$DEST/VERSION" 2>/dev/null)" = "$MINIO_VERSION" ]; then
  log "minio $MINIO_VERSION already built: $DEST/bin/minio"
  exit 0
fi
mkdir -p "$DEST/bin"
log "building minio $MINIO_VERSION (several minutes on a small machine)"
# GOFLAGS is cleared so that a project -mod setting does not apply to this foreign module;
# CGO is off: the server does not need it and a static binary runs anywhere.
GOFLAGS= CGO_ENABLED=0 GOBIN="$DEST/bin" "$GO" install "github.com/minio/minio@$MINIO_VERSION"
echo "$MINIO_VERSION" > "$DEST/VERSION"
log "built $DEST/bin/minio"
