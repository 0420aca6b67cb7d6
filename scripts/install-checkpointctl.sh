#!/usr/bin/env bash
# Builds checkpointctl, the checkpoint-restore project's tool that reads container checkpoint
# archives, which the end-to-end tests (test/e2e) run on the archives `gpucr checkpoint
# --export` writes.
# Pinned to 1.6.0, the one Debian ships; 1.7.0 needs a go-criu release the proxy does not serve.
set -euo pipefail
exec bash "$(dirname "$0")/install-go-tool.sh" checkpointctl github.com/checkpoint-restore/checkpointctl v1.6.0
