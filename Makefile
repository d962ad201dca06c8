# metasync — build, test, run, bench, lint.
#
# The integration tests and `make run` need a control plane (kube-apiserver
# v1.37.2 and etcd v3.6.16). hack/envtest-assets.sh builds both from the Go
# module proxy into a cache folder outside the repository the first time
# (minutes on 2 cores) and reuses them afterwards.

GO        ?= go
BIN       ?= bin
PKGS       = ./...

.PHONY: all build test unit lint fmt vet envtest clean

all: build

build:
	$(GO) build -o $(BIN)/metasync ./cmd/metasync

## envtest: build (once) the control-plane binaries and print their folder.
envtest:
	@bash hack/envtest-assets.sh

## test: lint, then every test with -race on a real control plane.
test: lint
	@assets=$$(bash hack/envtest-assets.sh) && \
	  echo "KUBEBUILDER_ASSETS=$$assets" && \
	  KUBEBUILDER_ASSETS=$$assets $(GO) test -race -count=1 $(PKGS)

## unit: the tests that need no control plane (integration tests skip).
unit:
	KUBEBUILDER_ASSETS= $(GO) test -race -count=1 $(PKGS)

lint: fmt vet

fmt:
	@out=$$(gofmt -l $$(git ls-files '*.go')); \
	  if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet $(PKGS)

clean:
	rm -rf $(BIN)
