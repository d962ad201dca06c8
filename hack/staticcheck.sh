#!/usr/bin/env bash
# Builds staticcheck, the linter that `make lint` runs after go vet, from
# the Go module proxy into a cache folder outside the repository, once
# (about a minute on 2 cores); prints its path on stdout (progress on
# stderr). Fails when it cannot be built.
#
#   METASYNC_STATICCHECK_DIR  where it goes
#                             (default: ${XDG_CACHE_HOME:-$HOME/.cache}/metasync/staticcheck-v0.8.2)
set -euo pipefail

VERSION=0.8.2
cache_root=${XDG_CACHE_HOME:-$HOME/.cache}/metasync
dir=${METASYNC_STATICCHECK_DIR:-$cache_root/staticcheck-v$VERSION}

if [ -x "$dir/staticcheck" ]; then
  printf '%s\n' "$dir/staticcheck"
  exit 0
fi
printf 'staticcheck: building v%s into %s (once)\n' "$VERSION" "$dir" >&2
mkdir -p "$dir"
# Outside the repository, so that its module is not this one.
cd "$cache_root"
GOFLAGS= GOBIN="$dir" go install "honnef.co/go/tools/cmd/staticcheck@v$VERSION" >&2
printf '%s\n' "$dir/staticcheck"
