#!/usr/bin/env bash
# Join this machine to a running STAPO Ray cluster as a worker node.
#   RAY_HEAD_ADDRESS=10.0.0.1:6379 STAPO_CHECKPOINT_DIR=/shared/stapo bash launch/ray/start_worker.sh
# All settings are environment variables (defaults in launch/ray/common.sh, table in launch/README.md).
set -euo pipefail
# shellcheck source=launch/ray/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

RAY_HEAD_ADDRESS="${RAY_HEAD_ADDRESS:-}"
[[ -n "$RAY_HEAD_ADDRESS" ]] || stapo_die "set RAY_HEAD_ADDRESS=<head host>:<GCS port> (start_head.sh prints it)"
command -v ray >/dev/null || stapo_die "'ray' is not on PATH: activate the environment that has stapo installed"
stapo_setup_auth client
stapo_check_network
stapo_check_shared_dir
stapo_common_ray_args
RAY_ARGS+=(--address "$RAY_HEAD_ADDRESS")

# The head may still be starting (SLURM launches all nodes at once): wait until its GCS port answers.
RAY_HEAD_WAIT_S="${RAY_HEAD_WAIT_S:-120}"
head_host="${RAY_HEAD_ADDRESS%:*}"
head_port="${RAY_HEAD_ADDRESS##*:}"
waited=0
until (exec 3<>"/dev/tcp/$head_host/$head_port") 2>/dev/null; do
  ((waited >= RAY_HEAD_WAIT_S)) && stapo_die "no Ray head answers at $RAY_HEAD_ADDRESS after ${RAY_HEAD_WAIT_S}s (is start_head.sh running there? firewall?)"
  sleep 2
  waited=$((waited + 2))
done
stapo_log "joining Ray cluster at $RAY_HEAD_ADDRESS (temp dir $RAY_TEMP_DIR)"
exec ray start "${RAY_ARGS[@]}"
