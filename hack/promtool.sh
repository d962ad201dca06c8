#!/usr/bin/env bash
# Builds promtool, Prometheus's own rule checker and rule unit-test runner,
# from the Go module proxy into a cache folder outside the repository, once;
# prints its path on stdout (progress on stderr). deploy/monitoring_test.go
# runs it on deploy/monitoring: PromQL parsed by Prometheus itself, and each
# alert fired on synthetic series. A build that fails prints nothing: the
# test then skips and says why.
#
#   METASYNC_PROMTOOL_DIR  where promtool goes
#                          (default: ${XDG_CACHE_HOME:-$HOME/.cache}/metasync/promtool-v0.316.0)
set -uo pipefail

VERSION=0.316.0
cache_root=${XDG_CACHE_HOME:-$HOME/.cache}/metasync
dir=${METASYNC_PROMTOOL_DIR:-$cache_root/promtool-v$VERSION}

if [ -x "$dir/promtool" ]; then
  printf '%s\n' "$dir/promtool"
  exit 0
fi
log() { printf 'promtool: %s\n' "$*" >&2; }
mkdir -p "$dir" "$cache_root"
work=$(mktemp -d "$cache_root/promtool-build.XXXXXX")
trap 'rm -rf "$work"' EXIT
log "building promtool v$VERSION into $dir (once; a few minutes)"
cd "$work"
export GOFLAGS=-mod=mod
cat > go.mod <<'MOD'
module promtoolbuild

go 1.26.0
MOD
cat > tools.go <<'TOOLS'
//go:build tools

package tools

import _ "github.com/prometheus/prometheus/cmd/promtool"
TOOLS
if go get "github.com/prometheus/prometheus/cmd/promtool@v$VERSION" >&2 &&
  go mod tidy >&2 &&
  go build -o "$dir/promtool.tmp" github.com/prometheus/prometheus/cmd/promtool >&2; then
  mv "$dir/promtool.tmp" "$dir/promtool"
  printf '%s\n' "$dir/promtool"
else
  log "build failed: the alert tests will skip"
fi
