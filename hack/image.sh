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

if [ ! -r "$CA" ]; then
  echo "hack/image.sh: no CA bundle at $CA (install ca-certificates, or set CA_BUNDLE)" >&2
  exit 1
fi
engine=${CONTAINER_ENGINE:-}
if [ -z "$engine" ]; then
  if command -v docker >/dev/null && docker info >/dev/null 2>&1; then
    engine=docker
  elif command -v podman >/dev/null; then
    engine=podman
  elif command -v buildah >/dev/null; then
    engine=buildah
  else
    echo "hack/image.sh: no container engine: install docker, podman or buildah (Debian: apt-get install podman buildah runc)" >&2
    exit 1
  fi
fi

ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=$VERSION" -o "$ctx/metasync" ./cmd/metasync
cp "$CA" "$ctx/ca-certificates.crt"
echo 'nonroot:x:65532:65532:nonroot:/nonexistent:/sbin/nologin' > "$ctx/passwd"
echo 'nonroot:x:65532:' > "$ctx/group"
cp Dockerfile "$ctx/Dockerfile"

case "$engine" in
  docker) docker build -q -t "$IMAGE" "$ctx" >&2 ;;
  podman) podman build -q --isolation chroot -t "$IMAGE" "$ctx" >&2 ;;
  buildah) buildah bud -q --isolation chroot -t "$IMAGE" "$ctx" >&2 ;;
  *) "$engine" build -t "$IMAGE" "$ctx" >&2 ;;
esac
echo "$IMAGE"
