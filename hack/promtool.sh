#!/usr/bin/env bash
# Finds or builds promtool, Prometheus's own rule checker and rule unit-test
# runner, and prints its path on stdout (progress on stderr).
# deploy/monitoring_test.go runs it on deploy/monitoring: PromQL parsed by
# Prometheus itself, and each alert fired on synthetic series.
#
# A promtool on PATH (Debian's package prometheus ships one) is taken when
# it runs those tests: they are run with it once for each promtool and
# version of the rules, and a pass is kept in the cache folder. Otherwise promtool is built from the
# Go module proxy into a cache folder outside the repository, once (about
# 16 minutes on 2 cores when Go's build cache is cold). A build that fails
# prints nothing: the test then skips and says why.
#
#   METASYNC_PROMTOOL_DIR  where the built promtool goes
#                          (default: ${XDG_CACHE_HOME:-$HOME/.cache}/metasync/promtool-v0.316.0)
#   METASYNC_PROMTOOL_PATH 0 to ignore a promtool on PATH
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

# A promtool on PATH, when the alert tests pass with it. A pass is kept for
# that promtool (its version line) and those rules (a hash of
# deploy/monitoring), so the test runs once for each; a failure is not
# kept, and the test runs again next time.
if [ "${METASYNC_PROMTOOL_PATH:-1}" != 0 ] && candidate=$(command -v promtool); then
  root=$(cd "$(dirname "$0")/.." && pwd)
  id=$({ "$candidate" --version 2>&1 | head -1; cat "$root"/deploy/monitoring/* "$root"/deploy/monitoring_test.go; } | cksum | cut -d' ' -f1)
  verdict="$cache_root/promtool-path-ok-$id"
  if [ ! -f "$verdict" ] &&
    (cd "$root" && env -u KUBEBUILDER_ASSETS PROMTOOL="$candidate" go test -count=1 -run '^TestAlertRules$' ./deploy/ >&2); then
    echo "$candidate" > "$verdict"
  fi
  if [ -f "$verdict" ]; then
    log "using $candidate ($("$candidate" --version 2>&1 | head -1))"
    printf '%s\n' "$candidate"
    exit 0
  fi
  log "$candidate does not run the alert tests: building promtool instead"
fi
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
