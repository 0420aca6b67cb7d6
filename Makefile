# gpucr: `make demo` and `make test` work on a fresh Debian bookworm machine as root.
GO      ?= go
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X main.version=$(VERSION)
# go-nvml's cgo bindings use NVML calls that its header marks deprecated: keep builds quiet.
export CGO_CFLAGS ?= -O2 -g -Wno-deprecated-declarations
GPUCR_BUILD_CACHE ?= /var/cache/gpucr-build
GOLANGCI_LINT ?= $(GPUCR_BUILD_CACHE)/golangci-lint/bin/golangci-lint

.PHONY: all deps build lint test fuzz demo bundle engines kube storebench clean

all: build

deps:
	bash scripts/install-deps.sh && bash scripts/install-minio.sh && bash scripts/install-checkpointctl.sh && \
		bash scripts/install-lint.sh

build: deps
	$(GO) build -ldflags "$(LDFLAGS)" -o bin/gpucr ./cmd/gpucr
	$(GO) build -o bin/counter ./test/workloads/counter
	$(GO) build -o bin/gpucr-bench ./cmd/gpucr-bench

# lint: gofmt, go vet and golangci-lint (.golangci.yml) over the whole tree; go vet over the
# kube part's device plugin too, a module of its own (test/kube/deviceplugin).
lint: deps
	test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); exit 1; }
	$(GO) vet ./...
	cd test/kube/deviceplugin && $(GO) vet .
	$(GOLANGCI_LINT) run ./...

test: build lint
	$(GO) test -count=1 -timeout 20m ./...
	GO=$(GO) bash scripts/fuzz.sh

# fuzz: every fuzz target for FUZZTIME each (make test runs them for 4s).
fuzz:
	GO=$(GO) FUZZTIME=$${FUZZTIME:-30s} bash scripts/fuzz.sh

demo: build
	bash scripts/demo.sh

# bundle: everything the GPU machine needs for the device test plan, in bundle/ (git-ignored).
bundle: build
	bash scripts/bundle.sh

# engines: podman and containerd from this machine's packages, for test/gpu/engines_plan.sh
# (engines/engines.tar.xz, git-ignored, carried to the GPU machine beside bundle/).
engines: bundle
	bash scripts/bundle-engines.sh

# kube: the kubelet, containerd 2.x and crictl (built from the Go module proxy) and the bundle, for
# engines_plan.sh's kube part on the GPU machine (kube/, git-ignored; docs/kubernetes.md).
kube: bundle
	bash scripts/bundle-kube.sh

# storebench: the bundle and a MinIO server, compressed to fit one device run, for
# bench-stream.sh against MinIO on the GPU machine (storebench/, git-ignored; docs/storage.md).
storebench: bundle
	bash scripts/bundle-storebench.sh

clean:
	rm -rf bin bundle engines kube storebench
