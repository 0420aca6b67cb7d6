#!/usr/bin/env bash
# Builds the golangci-lint that `make lint` runs (config: .golangci.yml), pinned so that every
# machine reports the same findings.
set -euo pipefail
exec bash "$(dirname "$0")/install-go-tool.sh" golangci-lint github.com/golangci/golangci-lint/v2/cmd/golangci-lint v2.15.0 \
  "about two minutes on 2 cores"
