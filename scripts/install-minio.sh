#!/usr/bin/env bash
# Builds the MinIO server that internal/store's tests run on loopback, so that the S3 backend
# is tested against a real S3 implementation rather than a fake. MinIO no longer publishes
# release tags as Go versions, hence the pinned pseudo-version: the upstream master commit of
# 2026-02-12.
set -euo pipefail
exec bash "$(dirname "$0")/install-go-tool.sh" minio github.com/minio/minio v0.0.0-20260212201848-7aac2a2c5b7c \
  "several minutes on a small machine"
