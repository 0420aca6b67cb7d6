#!/usr/bin/env bash
# Builds a Go tool from the Go module proxy at a pinned version into
# $GPUCR_BUILD_CACHE/NAME/bin, where the tests and make look:
#   install-go-tool.sh NAME PACKAGE VERSION [NOTE]
# Idempotent: skipped when that version is already built (recorded in NAME/VERSION). The
# install-*.sh scripts say which tools, at which version, and why.
set -euo pipefail

NAME=$1 PACKAGE=$2 VERSION=$3 NOTE=${4:-}
DEST=${GPUCR_BUILD_CACHE:-/var/cache/gpucr-build}/$NAME
GO=${GO:-go}

log() { printf 'install-%s: %s\n' "$NAME" "$*" >&2; }

if [ -x "$DEST/bin/$(basename "$PACKAGE")" ] && [ "$(cat "$DEST/VERSION" 2>/dev/null)" = "$VERSION" ]; then
  log "$NAME $VERSION already built: $DEST/bin/$(basename "$PACKAGE")"
  exit 0
fi
mkdir -p "$DEST/bin"
log "building $NAME $VERSION${NOTE:+ ($NOTE)}"
# GOFLAGS is cleared so that a project -mod setting does not apply to this foreign module;
# CGO is off: none of these tools needs it, and a static binary runs anywhere.
GOFLAGS= CGO_ENABLED=0 GOBIN="$DEST/bin" "$GO" install "$PACKAGE@$VERSION"
echo "$VERSION" > "$DEST/VERSION"
log "built $DEST/bin/$(basename "$PACKAGE")"
