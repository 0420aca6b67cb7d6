#!/usr/bin/env bash
# Builds the golangci-lint that `make lint` runs (config: .golangci.yml), pinned so that every
# machine reports the same findings, into $GPUCR_BUILD_CACHE/golangci-lint.
# Idempotent: skipped when that version is already built.
set -euo pipefail

LINT_VERSION=v2.15.0
WORK=${GPUCR_BUILD_CACHE:-/var/cache/gpucr-build}
DEST=$WORK/golangci-lint
GO=${GO:-go}

log() { printf 'install-lint: %s\n' "$*" >&2; }

if [ -x "$DEST/bin/golangci-lint" ] &&
  [ "v$("$DEST/bin/golangci-lint" version --short 2>/dev/null)" = "$LINT_VERSION" ]; then
  log "golangci-lint $LINT_VERSION already built: $DEST/bin/golangci-lint"
  exit 0
fi
mkdir -p "$DEST/bin"
log "building golangci-lint $LINT_VERSION (about two minutes on 2 cores)"
# GOFLAGS is cleared so that a project -mod setting does not apply to this foreign module.
GOFLAGS= GOBIN="$DEST/bin" "$GO" install "github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$LINT_VERSION"
log "built $DEST/bin/golangci-lint"
