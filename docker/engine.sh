#!/usr/bin/env bash
# Runs docker, or podman where docker has no daemon, with the flags this host needs:
#   docker/engine.sh build ...  |  docker/engine.sh run ...  |  docker/engine.sh image exists NAME
# STAPO_ENGINE=docker|podman picks one. podman gets runc with the cgroupfs manager where the host's
# cgroups are a hybrid layout (crun refuses it), and a containers.conf without default ulimits where
# this process may not raise them (podman would fail to set RLIMIT_NOFILE in every container).
set -euo pipefail

pick_engine() {
  if [ -n "${STAPO_ENGINE:-}" ]; then echo "$STAPO_ENGINE"; return; fi
  if command -v docker >/dev/null && docker info >/dev/null 2>&1; then echo docker; return; fi
  if command -v podman >/dev/null; then echo podman; return; fi
  echo "docker/engine.sh: neither a running docker nor podman found (apt-get install podman runc)" >&2
  exit 2
}

engine="$(pick_engine)"
if [ "$engine" = docker ]; then
  if [ "${1:-}" = "image" ] && [ "${2:-}" = "exists" ]; then
    exec docker image inspect "$3" >/dev/null 2>&1
  fi
  exec docker "$@"
fi

flags=()
if [ -d /sys/fs/cgroup/unified ] && command -v runc >/dev/null; then
  flags+=(--runtime runc --cgroup-manager cgroupfs)
fi
if ! python3 -c 'import resource; resource.setrlimit(resource.RLIMIT_NOFILE, (1048576, 1048576))' 2>/dev/null; then
  conf="${TMPDIR:-/tmp}/stapo-containers.conf"
  printf '[containers]\ndefault_ulimits = []\n' >"$conf"
  export CONTAINERS_CONF="$conf"
fi
exec podman "${flags[@]}" "$@"
