#!/usr/bin/env bash
# Builds the control plane used by the integration tests and `make run`:
# kube-apiserver v1.37.2 and etcd v3.6.16, from the Go module proxy, into a
# cache folder outside the repository. Reuses the binaries when present.
#
# Prints the folder that holds them (for KUBEBUILDER_ASSETS) on stdout;
# progress goes to stderr.
#
#   METASYNC_ASSETS_DIR  where the binaries go
#                        (default: ${XDG_CACHE_HOME:-$HOME/.cache}/metasync/envtest/k8s-v1.37.2-etcd-v3.6.16)
set -euo pipefail

K8S_VERSION=1.37.2
STAGING_VERSION=0.37.2
ETCD_VERSION=3.6.16

cache_root=${XDG_CACHE_HOME:-$HOME/.cache}/metasync/envtest
assets=${METASYNC_ASSETS_DIR:-$cache_root/k8s-v${K8S_VERSION}-etcd-v${ETCD_VERSION}}

log() { printf 'envtest-assets: %s\n' "$*" >&2; }

if [ -x "$assets/kube-apiserver" ] && [ -x "$assets/etcd" ]; then
  printf '%s\n' "$assets"
  exit 0
fi

mkdir -p "$assets"
# One build at a time: a second run (another terminal, a parallel test)
# waits for the first, then finds the binaries.
if command -v flock >/dev/null; then
  exec 9>"$cache_root/.build.lock"
  flock 9
  if [ -x "$assets/kube-apiserver" ] && [ -x "$assets/etcd" ]; then
    printf '%s\n' "$assets"
    exit 0
  fi
fi
work=$(mktemp -d "${cache_root}/build.XXXXXX" 2>/dev/null || { mkdir -p "$cache_root"; mktemp -d "${cache_root}/build.XXXXXX"; })
trap 'rm -rf "$work"' EXIT
export GOFLAGS=-mod=mod
export CGO_ENABLED=0

if [ ! -x "$assets/etcd" ]; then
  log "building etcd v${ETCD_VERSION} (first run only: minutes on 2 cores; a whole first run takes about 9)"
  mkdir -p "$work/etcd"
  (
    cd "$work/etcd"
    go mod init metasync.local/etcd-build >/dev/null 2>&1
    cat > tools.go <<GO
//go:build tools

package tools

import _ "go.etcd.io/etcd/server/v3"
GO
    go get "go.etcd.io/etcd/server/v3@v${ETCD_VERSION}" >&2
    go mod tidy >&2
    go build -v -trimpath -o "$assets/etcd.tmp" go.etcd.io/etcd/server/v3 2>&1 | sed "s/^/  compiling /" >&2
    mv "$assets/etcd.tmp" "$assets/etcd"
  )
  log "etcd ready"
fi

if [ ! -x "$assets/kube-apiserver" ]; then
  log "building kube-apiserver v${K8S_VERSION} (first run only: the longest step of a first run, minutes on 2 cores)"
  mkdir -p "$work/kas"
  (
    cd "$work/kas"
    go mod init metasync.local/kube-apiserver-build >/dev/null 2>&1
    go mod edit -require "k8s.io/kubernetes@v${K8S_VERSION}"
    # k8s.io/kubernetes points every staging module at ./staging/...; pin each
    # of them to its published version instead.
    modfile=$(go mod download -json "k8s.io/kubernetes@v${K8S_VERSION}" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
    for m in $(awk '$1 ~ /^k8s\.io\// && $2 == "=>" && $3 ~ /^\.\/staging/ {print $1}' "$modfile"); do
      go mod edit -replace "$m=$m@v${STAGING_VERSION}"
    done
    cat > tools.go <<GO
//go:build tools

package tools

import _ "k8s.io/kubernetes/cmd/kube-apiserver"
GO
    go mod tidy >&2
    go build -v -trimpath -o "$assets/kube-apiserver.tmp" k8s.io/kubernetes/cmd/kube-apiserver 2>&1 | sed "s/^/  compiling /" >&2
    mv "$assets/kube-apiserver.tmp" "$assets/kube-apiserver"
  )
  log "kube-apiserver ready"
fi

printf '%s\n' "$assets"
