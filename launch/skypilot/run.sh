#!/usr/bin/env bash
# SkyPilot's run step on every node of launch/skypilot/stapo.yaml. Rank 0 starts the Ray head
# (launch/ray/start_head.sh), waits for all nodes, runs `stapo doctor` with the job's shape and
# submits the recipe (launch/ray/submit.sh, waiting for its result); the other ranks join the head
# (launch/ray/start_worker.sh) and return. Re-running it (`sky exec`) reuses a running Ray cluster.
# SkyPilot sets SKYPILOT_NODE_RANK, SKYPILOT_NODE_IPS (one per line, head first),
# SKYPILOT_NUM_NODES, SKYPILOT_NUM_GPUS_PER_NODE and SKYPILOT_TASK_ID; the rest (STAPO_ARGS,
# STAPO_CHECKPOINT_DIR, STAPO_DOCTOR, STAPO_SMOKE, RAY_*) is in the task's envs (launch/README.md).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ray_dir="$here/../ray"
# shellcheck source=launch/ray/common.sh
source "$ray_dir/common.sh"

for var in SKYPILOT_NODE_RANK SKYPILOT_NODE_IPS SKYPILOT_NUM_NODES SKYPILOT_NUM_GPUS_PER_NODE; do
  [[ -n "${!var:-}" ]] || stapo_die "$var is not set: run this through SkyPilot (sky launch launch/skypilot/stapo.yaml)"
done
STAPO_ARGS="${STAPO_ARGS:-model_preset=qwen3_8b algo=stapo}"
STAPO_DOCTOR="${STAPO_DOCTOR:-1}"
STAPO_SMOKE="${STAPO_SMOKE:-0}"
STAPO_NODES_WAIT_S="${STAPO_NODES_WAIT_S:-600}"
SKYPILOT_TASK_ID="${SKYPILOT_TASK_ID:-stapo-$(date +%Y%m%d-%H%M%S)}"

mapfile -t node_ips <<<"$SKYPILOT_NODE_IPS"
head_ip="${node_ips[0]}"
# the address the other nodes reach this one at: SkyPilot's list, not Ray's guess (multi-homed VMs)
export RAY_NODE_IP="${RAY_NODE_IP:-${node_ips[$SKYPILOT_NODE_RANK]}}"
export RAY_HEAD_ADDRESS="$head_ip:$RAY_HEAD_PORT"
# the nodes do not share a home directory: one token for all of them comes as a SkyPilot secret
if [[ -z "${RAY_AUTH_TOKEN:-}" && "${RAY_AUTH_MODE:-}" != disabled ]]; then
  stapo_die "pass the same Ray token to every node: sky launch ... --secret RAY_AUTH_TOKEN=\$(openssl rand -hex 32)" \
    "(or --env RAY_AUTH_MODE=disabled on a private network)"
fi
stapo_setup_auth client

# SkyPilot runs its own Ray on these nodes (another port and temp dir): look for ours only
this_node_in_cluster() {
  pgrep -f -- "raylet.*$RAY_TEMP_DIR/session_" >/dev/null
}
head_answers() {
  (exec 3<>"/dev/tcp/$head_ip/$RAY_HEAD_PORT") 2>/dev/null
}

if ((SKYPILOT_NODE_RANK > 0)); then
  if this_node_in_cluster; then
    stapo_log "this node is already in the Ray cluster at $RAY_HEAD_ADDRESS"
  else
    bash "$ray_dir/start_worker.sh"
  fi
  exit 0
fi

if this_node_in_cluster && head_answers; then
  stapo_log "the Ray head is already running at $RAY_HEAD_ADDRESS"
else
  bash "$ray_dir/start_head.sh"
fi

# every node must have joined before the job asks for trainer.nnodes of them
alive_nodes() {
  python3 - "$RAY_HEAD_ADDRESS" <<'PY'
import sys

import ray

ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
print(sum(1 for node in ray.nodes() if node["Alive"]))
PY
}
waited=0
until (($(alive_nodes 2>/dev/null || echo 0) >= SKYPILOT_NUM_NODES)); do
  ((waited >= STAPO_NODES_WAIT_S)) &&
    stapo_die "not all $SKYPILOT_NUM_NODES nodes joined $RAY_HEAD_ADDRESS within ${STAPO_NODES_WAIT_S}s"
  sleep 5
  waited=$((waited + 5))
done
stapo_log "all $SKYPILOT_NUM_NODES nodes joined the Ray cluster at $RAY_HEAD_ADDRESS"

read -ra user_args <<<"$STAPO_ARGS"
shape=("trainer.nnodes=$SKYPILOT_NUM_NODES" "trainer.n_gpus_per_node=$SKYPILOT_NUM_GPUS_PER_NODE")
[[ -n "$STAPO_CHECKPOINT_DIR" ]] ||
  stapo_die "set STAPO_CHECKPOINT_DIR to storage every node mounts (file_mounts in stapo.yaml)"
ckpt="$STAPO_CHECKPOINT_DIR/ckpt/$SKYPILOT_TASK_ID"
export RAY_ADDRESS="http://127.0.0.1:$RAY_DASHBOARD_PORT"

if [[ "$STAPO_DOCTOR" == 1 ]]; then
  stapo doctor --address "$RAY_HEAD_ADDRESS" "${shape[@]}" "trainer.default_local_dir=$ckpt" ||
    stapo_die "stapo doctor found a problem (above); STAPO_DOCTOR=0 skips the preflight"
fi
if [[ "$STAPO_SMOKE" == 1 ]]; then
  stapo doctor --smoke --address "$RAY_ADDRESS" "trainer.default_local_dir=$STAPO_CHECKPOINT_DIR/smoke" ||
    stapo_die "the GPU smoke run failed (above); STAPO_SMOKE=0 skips it"
fi
STAPO_WAIT=1 STAPO_JOB_ID="$SKYPILOT_TASK_ID" bash "$ray_dir/submit.sh" "${user_args[@]}" "${shape[@]}" \
  "trainer.default_local_dir=$ckpt"
