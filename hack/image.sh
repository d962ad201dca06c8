#!/usr/bin/env bash
# Builds the metasync container image, offline as online: Go builds a
# static binary on this machine (-trimpath, its version stamped from git),
# and the Dockerfile copies it onto an empty base with CA certificates and
# the non-root user 65532. No base image is pulled.
#
#   hack/image.sh                      # IMAGE=metasync:latest
#   IMAGE=registry.example/metasync:v1 CONTAINER_ENGINE=podman hack/image.sh
#
# The engine is CONTAINER_ENGINE, or the first of docker (with a daemon),
# podman and buildah that works here. Prints the image's name.
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE=${IMAGE:-metasync:latest}
VERSION=${VERSION:-$(git describe --always --dirty 2>/dev/null || echo dev)}
CA=${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}

if [ ! -f "$CA" ] || [ ! -r "$CA" ]; then
  echo "hack/image.sh: no CA bundle file at $CA (install ca-certificates, or set CA_BUNDLE)" >&2
  exit 1
fi
engine=${CONTAINER_ENGINE:-}
if [ -n "$engine" ] && ! command -v "$engine" >/dev/null; then
  echo "hack/image.sh: CONTAINER_ENGINE=$engine: no such command (docker, podman or buildah)" >&2
  exit 1
fi
if [ -z "$engine" ]; then
  if command -v docker >/dev/null && docker info >/dev/null 2>&1; then
    engine=docker
  elif command -v podman >/dev/null; then
    engine=podman
  elif command -v buildah >/dev/null; then
    engine=buildah
  else
    echo "hack/image.sh: no container engine: install docker, podman or buildah (Debian: apt-get install podman)" >&2
    exit 1
  fi
fi

ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
# The image runs Linux on the engine's architecture (GOARCH= to choose),
# whatever this machine runs; its files are readable by user 65532 whatever
# the umask.
CGO_ENABLED=0 GOOS=linux GOARCH=${GOARCH:-$(go env GOARCH)} \
  go build -trimpath -ldflags "-s -w -X main.version=$VERSION" -o "$ctx/metasync" ./cmd/metasync
cp "$CA" "$ctx/ca-certificates.crt"
echo 'nonroot:x:65532:65532:nonroot:/nonexistent:/sbin/nologin' > "$ctx/passwd"
echo 'nonroot:x:65532:' > "$ctx/group"
cp Dockerfile "$ctx/Dockerfile"
chmod 0755 "$ctx" "$ctx/metasync"
chmod 0644 "$ctx/ca-certificates.crt" "$ctx/passwd" "$ctx/group" "$ctx/Dockerfile"
echo "binary: $(wc -c < "$ctx/metasync") bytes, linux/${GOARCH:-$(go env GOARCH)}, version $VERSION" >&2

case "$engine" in
  docker) docker build -q -t "$IMAGE" "$ctx" >&2 ;;
  podman) podman build -q --isolation chroot -t "$IMAGE" "$ctx" >&2 ;;
  buildah) buildah bud -q --isolation chroot -t "$IMAGE" "$ctx" >&2 ;;
  *) "$engine" build -t "$IMAGE" "$ctx" >&2 ;;
esac
echo "$IMAGE"
