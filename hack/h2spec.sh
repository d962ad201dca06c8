#!/usr/bin/env bash
# Builds h2spec, the HTTP/2 conformance suite that the xDS server's
# conformance test runs (cmd/metasync/internal/xds, TestH2Spec), from the Go
# module proxy into a cache folder outside the repository, once (under a
# minute on 2 cores); prints its path on stdout (progress on stderr).
# Fails when it cannot be built.
#
#   METASYNC_H2SPEC_DIR  where it goes
#                        (default: ${XDG_CACHE_HOME:-$HOME/.cache}/metasync/h2spec-v2.2.1)
set -euo pipefail

VERSION=2.2.1
cache_root=${XDG_CACHE_HOME:-$HOME/.cache}/metasync
dir=${METASYNC_H2SPEC_DIR:-$cache_root/h2spec-v$VERSION}

if [ -x "$dir/h2spec" ]; then
  printf '%s\n' "$dir/h2spec"
  exit 0
fi
printf 'h2spec: building v%s into %s (once)\n' "$VERSION" "$dir" >&2
mkdir -p "$dir"
# A throwaway module outside the repository: h2spec v2.2.1 has no go.mod
# of its own, so its dependencies are pinned here (the versions it was
# tried with), not taken at whatever is newest.
work=$(mktemp -d "$cache_root/h2spec-build.XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$work"
cat >go.mod <<'MOD'
module h2specbuild

go 1.22

require (
	github.com/fatih/color v1.19.0
	github.com/spf13/cobra v1.10.2
	github.com/summerwind/h2spec v2.2.1+incompatible
	golang.org/x/net v0.63.0
)
MOD
GOFLAGS=-mod=mod go build -o "$dir/h2spec" github.com/summerwind/h2spec/cmd/h2spec >&2
printf '%s\n' "$dir/h2spec"
