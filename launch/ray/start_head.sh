#!/usr/bin/env bash
# Start the Ray head node of a STAPO cluster on this machine.
#   STAPO_CHECKPOINT_DIR=/shared/stapo NCCL_SOCKET_IFNAME=eth0 GLOO_SOCKET_IFNAME=eth0 \
#     bash launch/ray/start_head.sh
# Then on every other node: RAY_HEAD_ADDRESS=<this host>:6379 bash launch/ray/start_worker.sh
# All settings are environment variables (defaults in launch/ray/common.sh, table in launch/README.md).
set -euo pipefail
# shellcheck source=launch/ray/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

command -v ray >/dev/null || stapo_die "'ray' is not on PATH: activate the environment that has stapo installed"
stapo_setup_auth head
stapo_check_network
stapo_check_shared_dir
stapo_common_ray_args
RAY_ARGS+=(--head --port "$RAY_HEAD_PORT" --ray-client-server-port "$RAY_CLIENT_PORT"
  --include-dashboard "$RAY_INCLUDE_DASHBOARD" --dashboard-host "$RAY_DASHBOARD_HOST"
  --dashboard-port "$RAY_DASHBOARD_PORT")

head_ip="${RAY_NODE_IP:-$(hostname -I 2>/dev/null | awk '{print $1}')}"
stapo_log "starting Ray head: GCS ${head_ip:-<this host>}:$RAY_HEAD_PORT, dashboard/job API port $RAY_DASHBOARD_PORT, temp dir $RAY_TEMP_DIR"
stapo_log "workers join with: RAY_HEAD_ADDRESS=${head_ip:-<this host>}:$RAY_HEAD_PORT bash launch/ray/start_worker.sh"
stapo_log "jobs are submitted with: RAY_ADDRESS=http://${head_ip:-<this host>}:$RAY_DASHBOARD_PORT bash launch/ray/submit.sh ..."
exec ray start "${RAY_ARGS[@]}"
