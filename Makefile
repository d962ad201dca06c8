# metasync — build, test, run, bench, lint.
#
# The integration tests and `make run` need a control plane (kube-apiserver
# v1.37.2 and etcd v3.6.16). hack/envtest-assets.sh builds both from the Go
# module proxy into a cache folder outside the repository the first time
# (minutes on 2 cores) and reuses them afterwards.

GO        ?= go
BIN       ?= bin
PKGS       = ./...

.PHONY: help fuzz all build test unit lint fmt vet staticcheck tidy envtest clean run first-run-note apply stop-apiserver start-apiserver bench bench-micro bench-xds chaos image

## all: the default: build.
all: build

## help: every target with what it does, from the "## target:" comments of
## this Makefile.
help:
	@awk 'function flush(  n, w, i, line) { if (t == "") return; n = split(d, w, " "); line = sprintf("  %-12s", t); \
	    for (i = 1; i <= n; i++) { if (length(line) + length(w[i]) > 90) { print line; line = sprintf("%14s", "") } line = line " " w[i] } print line; t = "" } \
	  /^## [a-z][a-z-]*:/ { flush(); sub(/^## /, ""); t = $$0; sub(/:.*/, "", t); d = $$0; sub(/^[^:]*: */, "", d); next } \
	  /^## / && t != "" { sub(/^## /, ""); d = d " " $$0; next } { flush() } END { flush() }' $(MAKEFILE_LIST)

## build: bin/metasync, its version stamped from git (`metasync version`).
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
build:
	$(GO) build -ldflags "-X main.version=$(VERSION)" -o $(BIN)/metasync ./cmd/metasync

## image: the container image IMAGE (a static binary on an empty base,
## user 65532), with docker (with a daemon), else podman, else buildah.
IMAGE ?= metasync:latest
image:
	IMAGE=$(IMAGE) VERSION=$(VERSION) hack/image.sh

## envtest: build (once) the control-plane binaries and print their folder.
envtest:
	@bash hack/envtest-assets.sh

## test: lint, every test with -race on a real control plane (the short
## convergence-under-faults test included, and h2spec against the xDS
## port), then a short run of each fuzzer.
test: lint
	@assets=$$(bash hack/envtest-assets.sh) && \
	  promtool=$$(bash hack/promtool.sh) && \
	  { [ -n "$$promtool" ] || echo "WARNING: no promtool: the alert rule tests skip"; } && \
	  h2spec=$$(bash hack/h2spec.sh) && \
	  echo "KUBEBUILDER_ASSETS=$$assets PROMTOOL=$$promtool H2SPEC=$$h2spec" && \
	  KUBEBUILDER_ASSETS=$$assets PROMTOOL=$$promtool H2SPEC=$$h2spec $(GO) test -race -count=1 -timeout 20m $(PKGS)
	@$(MAKE) --no-print-directory fuzz FUZZTIME=500x

## fuzz: run each fuzz target for FUZZTIME (default 1m); the seed corpora
## are in testdata/fuzz.
FUZZTIME ?= 1m
FUZZ_TARGETS = schema:FuzzLoad internal/plan:FuzzRuleEval internal/plan:FuzzGJSONPath internal/plan:FuzzScanSlice indexer:FuzzIncrementalEqualsRebuild indexer:FuzzEncodingRoundTrip sync:FuzzStreamList sync:FuzzFrames cmd/metasync/internal/server:FuzzHTTP internal/warmfile:FuzzDecode cmd/metasync/internal/xds:FuzzDecodeRequest cmd/metasync/internal/xds:FuzzConnection
fuzz:
	@for t in $(FUZZ_TARGETS); do \
	  pkg=$${t%%:*}; name=$${t##*:}; \
	  echo "fuzz $$name ($$pkg, $(FUZZTIME))"; \
	  out=$$($(GO) test -run '^$$' -fuzz "^$$name$$" -fuzztime $(FUZZTIME) ./$$pkg/ 2>&1); rc=$$?; \
	  if [ $$rc -ne 0 ]; then echo "$$out"; exit 1; fi; \
	  echo "$$out" | grep -E '^fuzz: elapsed' | tail -1; \
	done

## unit: the tests that need no control plane (integration tests skip).
unit:
	KUBEBUILDER_ASSETS= $(GO) test -race -count=1 $(PKGS)

## lint: fmt, vet, staticcheck and tidy.
lint: fmt vet staticcheck tidy

## fmt: fails on a file that gofmt would change, and names it.
fmt:
	@out=$$(gofmt -l $$(git ls-files '*.go')); \
	  if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

## vet: go vet on every package.
vet:
	$(GO) vet $(PKGS)

## staticcheck: the staticcheck linter on every package (hack/staticcheck.sh
## builds it once into the cache folder).
staticcheck:
	@sc=$$(bash hack/staticcheck.sh) && echo "staticcheck ./..." && $$sc ./...

## tidy: fails when go.mod or go.sum is not as `go mod tidy` writes it,
## and shows the difference.
tidy:
	@$(GO) mod tidy -diff || { echo "go.mod or go.sum is not tidy: run go mod tidy"; exit 1; }

## clean: removes bin/.
clean:
	rm -rf $(BIN)

## run: a local control plane with the AppModel example, and metasync serve
## on LISTEN (127.0.0.1:8080; port 0 picks a free one) and xDS on
## XDS_LISTEN (127.0.0.1:18000; XDS_LISTEN= for none), with gRPC servers on
## this host's address behind the example's Services, so that xDS and
## resolver clients get answers. It serves bin/run-config.yaml, a copy of
## examples/appmodel/config.yaml written anew at each run (edit it while it
## runs to try a live reload), or CONFIG, a file of your own. The first
## run builds kube-apiserver and etcd (minutes). Ctrl-C stops everything,
## also when the output is piped (make run 2>&1 | tee run.log); with tee
## -i (make run 2>&1 | tee -i run.log) tee ignores the Ctrl-C and keeps
## the stop's messages too. CLUSTERS=2 starts a second control plane,
## west, and serves both: a copy of examples/clusters/config.yaml, east
## (the first) the daemon's own connection, west read through the reader
## of examples/clusters/remote-reader.yaml (docs/clusters.md, "Try it
## with make run").
LISTEN ?= 127.0.0.1:8080
XDS_LISTEN ?= 127.0.0.1:18000
CONFIG ?=
CLUSTERS ?= 1
run: first-run-note build
	@assets=$$(bash hack/envtest-assets.sh) && \
	  $(GO) build -o $(BIN)/devcluster ./hack/devcluster && \
	  exec env KUBEBUILDER_ASSETS=$$assets $(BIN)/devcluster --metasync $(BIN)/metasync --listen $(LISTEN) \
	    --xds-listen "$(XDS_LISTEN)" --bootstrap-out $(BIN)/xds-bootstrap.json --clusters $(CLUSTERS) \
	    $(if $(CONFIG),--config $(CONFIG),--config-copy $(BIN)/run-config.yaml) --kubeconfig-out $(BIN)/dev-kubeconfig \
	    --control $(BIN)/devcluster.sock

## first-run-note: says, before anything is built, what a first run of make run costs.
first-run-note:
	@if [ ! -x "$${METASYNC_ASSETS_DIR:-$${XDG_CACHE_HOME:-$$HOME/.cache}/metasync/envtest/k8s-v1.37.2-etcd-v3.6.16}/kube-apiserver" ]; then \
	  echo "==> first run: building metasync, then kube-apiserver v1.37.2 and etcd v3.6.16 from source (about 9 minutes on 2 cores with an empty Go build cache, more on a busy machine; later runs start in seconds)"; fi

## apply: applies the YAML files FILE (space-separated) to the cluster of a
## running `make run`, with server-side apply: no kubectl needed. With
## `make run CLUSTERS=2`, CLUSTER=west applies them to west
## (bin/dev-kubeconfig-west), CLUSTER=east or none to east.
FILE ?=
CLUSTER ?=
apply:
	@$(GO) build -o $(BIN)/devcluster ./hack/devcluster && $(BIN)/devcluster apply --kubeconfig $(BIN)/dev-kubeconfig $(if $(CLUSTER),--cluster $(CLUSTER)) $(FILE)

## stop-apiserver: stops the kube-apiserver of cluster CLUSTER (west
## unless named) of a running `make run CLUSTERS=2` (or east of `make
## run`): metasync is cut off from it, its etcd keeps the data.
stop-apiserver:
	@$(GO) build -o $(BIN)/devcluster ./hack/devcluster && $(BIN)/devcluster apiserver --control $(BIN)/devcluster.sock stop $(or $(CLUSTER),west)

## start-apiserver: starts the kube-apiserver that stop-apiserver stopped
## again, on its address, with its certificates and data.
start-apiserver:
	@$(GO) build -o $(BIN)/devcluster ./hack/devcluster && $(BIN)/devcluster apiserver --control $(BIN)/devcluster.sock start $(or $(CLUSTER),west)

## bench: metasync side by side with the plain informer on one control
## plane; N=100000 for the large run (see BENCHMARKS.md). BENCH_FLAGS
## passes flags to hack/bench: -check fails on a missed target, -benchstat
## FILE writes every measure for benchstat.
N ?= 10000
BENCH_FLAGS ?=
bench:
	@assets=$$(bash hack/envtest-assets.sh) && \
	  $(GO) build -o $(BIN)/bench ./hack/bench && \
	  $(GO) build -o $(BIN)/metasync ./cmd/metasync && \
	  $(GO) build -o $(BIN)/bareinformer ./hack/bareinformer && \
	  KUBEBUILDER_ASSETS=$$assets $(BIN)/bench -n $(N) -metasync $(BIN)/metasync $(BENCH_FLAGS)

## bench-micro: the indexer's Go benchmarks, with allocations, among
## them BenchmarkWriteWhileBusy (a write's latency to one source, p50 and
## p99, while another is written, explained or relisted).
bench-micro:
	$(GO) test -run '^$$' -bench . -benchmem -count 6 ./indexer/ | tee bench-micro.txt

## bench-xds: the xDS server side by side with go-control-plane's
## (hack/xdspeer) on one control plane: 10,000 raw ADS clients over 100
## targets, then 100 clients following 1,000 targets each (see
## BENCHMARKS.md, "xDS for a fleet"). Every client comes from this host,
## one caller: the per-caller limits are off. XDS_FLAGS passes flags to
## both runs of hack/xdsload.
XDS_FLAGS ?=
bench-xds:
	@assets=$$(bash hack/envtest-assets.sh) && \
	  $(GO) build -o $(BIN)/xdsload ./hack/xdsload && \
	  $(GO) build -o $(BIN)/metasync ./cmd/metasync && \
	  export KUBEBUILDER_ASSETS=$$assets METASYNC_XDS_MAX_CONNECTIONS=12000 \
	    METASYNC_XDS_MAX_CONNECTIONS_PER_CALLER=0 METASYNC_XDS_MAX_STREAMS_PER_CALLER=0 \
	    METASYNC_XDS_MAX_NAMES_PER_CALLER=0 && \
	  $(BIN)/xdsload -bin $(BIN)/metasync -peer -client h2 -clients 10000 -targets 100 -rate 20 -for 20s $(XDS_FLAGS) && \
	  $(BIN)/xdsload -bin $(BIN)/metasync -peer -client h2 -clients 100 -targets 1000 -follow 1000 \
	    -endpoints 10 -rate 20 -for 20s -connect-timeout 300s $(XDS_FLAGS)

## chaos: the full convergence test under faults (2,000 operations); its
## report is in RELIABILITY.md.
chaos:
	@assets=$$(bash hack/envtest-assets.sh) && \
	  KUBEBUILDER_ASSETS=$$assets METASYNC_CHAOS_OPS=2000 METASYNC_CHAOS_FULL=1 METASYNC_CHAOS_REPORT=$(CURDIR)/chaos-report.txt \
	  $(GO) test -count=1 -v -timeout 20m -run TestConvergenceUnderFaults ./test/chaos/
	@cat chaos-report.txt
