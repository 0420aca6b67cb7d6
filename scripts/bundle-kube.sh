#!/usr/bin/env bash
# Builds kube/: what test/gpu/engines_plan.sh's kube part runs on the GPU machine, which has
# no Kubernetes: the kubelet and containerd 2.x (whose CRI plugin checkpoints a container for
# the kubelet and restores one from a checkpoint image), built from the Go module proxy, and
# crictl (the CRI's own client, for the plan's CRI-level part), a static busybox from this
# machine's packages for the pod sandbox's pause image, and the plan's GPU device plugin
# (test/kube/deviceplugin, a module of its own). Nothing is installed here.
#   kube/kube.tar.xz     bin/{kubelet,containerd,containerd-shim-runc-v2,ctr,crictl,busybox,gpu-device-plugin}
#   kube/bundle.tar.xz   bundle/ (make bundle), stripped
#   kube/MANIFEST        versions and sizes
# The kubelet lives in the k8s.io/kubernetes module, whose go.mod points its k8s.io/*
# requirements (v0.0.0) at its own staging directories; a module of our own requiring it
# replaces each with the published release of the same minor (v1.N.P -> v0.N.P).
# Carried as one folder: mkdir -p bundle && tar -xJf kube/bundle.tar.xz -C bundle &&
# cd bundle && bash engines_plan.sh kube
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/txz.sh
KUBERNETES=${GPUCR_KUBERNETES_VERSION:-v1.34.2}
CONTAINERD=${GPUCR_CONTAINERD_VERSION:-v2.2.1}
CRICTL=${GPUCR_CRICTL_VERSION:-v1.34.0}
out=kube
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
p=$work/prefix; mkdir -p "$p/bin"
export GOFLAGS= CGO_ENABLED=0

echo "bundle-kube: containerd $CONTAINERD" >&2
GOBIN=$p/bin go install -ldflags "-s -w" -tags "no_btrfs no_devmapper no_zfs" \
  "github.com/containerd/containerd/v2/cmd/containerd@$CONTAINERD" \
  "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@$CONTAINERD" \
  "github.com/containerd/containerd/v2/cmd/ctr@$CONTAINERD"

echo "bundle-kube: crictl $CRICTL" >&2
GOBIN=$p/bin go install -ldflags "-s -w" "sigs.k8s.io/cri-tools/cmd/crictl@$CRICTL"

echo "bundle-kube: kubelet $KUBERNETES (a few minutes on two cores)" >&2
m=$work/kubelet; mkdir -p "$m"
staging=$(cd "$m" && go mod download -json "k8s.io/kubernetes@$KUBERNETES" |
  sed -n 's/.*"GoMod": "\(.*\)",*/\1/p' | xargs grep -E '^\s+k8s.io/\S+ v0\.0\.0$' | awk '{print $1}')
[ -n "$staging" ] || { echo "bundle-kube: no staging modules found in k8s.io/kubernetes@$KUBERNETES's go.mod" >&2; exit 1; }
{
  printf 'module gpucr.test/kubelet\n\ngo 1.24\n\nrequire k8s.io/kubernetes %s\n' "$KUBERNETES"
  for s in $staging; do echo "replace $s => $s v0${KUBERNETES#v1}"; done
} > "$m/go.mod"
printf 'package kubelet\n\nimport _ "k8s.io/kubernetes/cmd/kubelet/app"\n' > "$m/kubelet.go"
(cd "$m" && GOFLAGS=-mod=mod go mod tidy && go build -ldflags "-s -w" -o "$p/bin/kubelet" k8s.io/kubernetes/cmd/kubelet)

echo "bundle-kube: the GPU device plugin" >&2
(cd test/kube/deviceplugin && go build -ldflags "-s -w" -o "$p/bin/gpu-device-plugin" .)

(cd "$work" && apt-get download -qq busybox-static) ||
  { echo "bundle-kube: apt-get download busybox-static failed (run apt-get update?)" >&2; exit 1; }
dpkg -x "$work"/busybox-static_*.deb "$work/bb"
cp "$work/bb/bin/busybox" "$p/bin/"

rm -rf "$out"; mkdir -p "$out"
txz "$p" "$out/kube.tar.xz"
bundle_txz "$out/bundle.tar.xz"
{
  echo "# kube/ built $(date -u +%F) on $(. /etc/os-release && echo "$PRETTY_NAME")"
  echo "kubelet $KUBERNETES, containerd $CONTAINERD, crictl $CRICTL (Go module proxy, CGO off, stripped)"
  dpkg-deb -f "$work"/busybox-static_*.deb Package Version | paste -sd' '
  (cd "$p/bin" && ls -l | awk 'NR > 1 {print $5, $9}')
  du -sh "$out"/*.tar.xz
} > "$out/MANIFEST"
cat "$out/MANIFEST"
