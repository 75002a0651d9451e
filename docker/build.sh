#!/usr/bin/env bash
# Builds the images with docker or podman (docker/engine.sh picks):
#   docker/build.sh base TAG          the stand-in base (docker/base/Dockerfile) on a Debian root file system
#   docker/build.sh image BASE TAG [ARGS...]   the STAPO image (docker/Dockerfile) on BASE; ARGS go to the build
#                                              (--build-arg STAPO_UID=1234)
# Run from the repository root. The host's CA bundle (STAPO_BUILD_CA, default Debian's path) and a pip.conf
# (STAPO_PIP_CONF, for a package mirror) reach pip as build secrets, never a layer.
set -euo pipefail
cd "$(dirname "$0")/.."
engine=docker/engine.sh
ROOTFS="${STAPO_ROOTFS:-localhost/stapo-rootfs:bookworm}"
# what the stand-in base needs beyond minbase: a venv, the C compiler and headers triton builds its
# launchers with, the account tools the image's user is made with, and ps for Ray
ROOTFS_PACKAGES=python3,python3-venv,python3-dev,gcc,libc6-dev,ca-certificates,passwd,procps,libnuma1

secrets=()
ca="${STAPO_BUILD_CA:-/etc/ssl/certs/ca-certificates.crt}"
if [ -s "$ca" ]; then secrets+=(--secret "id=pip_cert,src=$ca"); fi
if [ -n "${STAPO_PIP_CONF:-}" ]; then secrets+=(--secret "id=pip_conf,src=$STAPO_PIP_CONF"); fi

build() {  # build DOCKERFILE TAG [--build-arg ...]
  local file="$1" tag="$2"; shift 2
  local format=()
  # podman's default OCI format drops the Dockerfile's SHELL; docker's format keeps it
  if [ "$("$engine" --version | cut -d' ' -f1)" = podman ]; then format=(--format docker); fi
  "$engine" build "${format[@]}" --network host --ignorefile docker/Dockerfile.dockerignore \
    "${secrets[@]}" -f "$file" -t "$tag" "$@" .
}

rootfs() {
  if "$engine" image exists "$ROOTFS"; then return; fi
  command -v mmdebstrap >/dev/null || { echo "docker/build.sh: mmdebstrap is needed (apt-get install mmdebstrap)" >&2; exit 2; }
  local tar; tar="$(mktemp -d)/rootfs.tar"
  local mirror=()  # STAPO_DEBIAN_MIRROR: a mirror of Debian's archive; mmdebstrap's default otherwise
  if [ -n "${STAPO_DEBIAN_MIRROR:-}" ]; then mirror=("$STAPO_DEBIAN_MIRROR"); fi
  mmdebstrap --variant=minbase --include="$ROOTFS_PACKAGES" bookworm "$tar" "${mirror[@]}"
  "$engine" import "$tar" "$ROOTFS"
  rm -rf "$(dirname "$tar")"
}

case "${1:-}" in
  base) rootfs; build docker/base/Dockerfile "$2" --build-arg "ROOTFS=$ROOTFS" ;;
  image) build docker/Dockerfile "$3" --build-arg "BASE_IMAGE=$2" "${@:4}" ;;
  *) echo "usage: docker/build.sh base TAG | image BASE TAG [BUILD ARGS...]" >&2; exit 2 ;;
esac
