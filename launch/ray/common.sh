# shellcheck shell=bash
# Shared by start_head.sh and start_worker.sh (sourced, not run). Every setting is an environment
# variable with a default; see launch/README.md for the full table.

# --- where Ray keeps its sockets, logs and spilled objects on this node ----------------------------
# Keep it short (Ray's Unix socket paths are limited to ~107 characters) and node-local (not NFS).
RAY_TEMP_DIR="${RAY_TEMP_DIR:-/tmp/ray}"
# Ports. The GCS port and the dashboard port are the two a user has to know; the others only matter
# behind a firewall or when two Ray nodes share one host (each needs its own agent port).
RAY_HEAD_PORT="${RAY_HEAD_PORT:-6379}"
RAY_DASHBOARD_HOST="${RAY_DASHBOARD_HOST:-0.0.0.0}"
RAY_DASHBOARD_PORT="${RAY_DASHBOARD_PORT:-8265}"
RAY_CLIENT_PORT="${RAY_CLIENT_PORT:-10001}"
RAY_DASHBOARD_AGENT_LISTEN_PORT="${RAY_DASHBOARD_AGENT_LISTEN_PORT:-52365}"
RAY_NODE_MANAGER_PORT="${RAY_NODE_MANAGER_PORT:-}"
RAY_OBJECT_MANAGER_PORT="${RAY_OBJECT_MANAGER_PORT:-}"
RAY_DASHBOARD_AGENT_GRPC_PORT="${RAY_DASHBOARD_AGENT_GRPC_PORT:-}"
RAY_METRICS_EXPORT_PORT="${RAY_METRICS_EXPORT_PORT:-}"
RAY_RUNTIME_ENV_AGENT_PORT="${RAY_RUNTIME_ENV_AGENT_PORT:-}"
RAY_MIN_WORKER_PORT="${RAY_MIN_WORKER_PORT:-}"
RAY_MAX_WORKER_PORT="${RAY_MAX_WORKER_PORT:-}"
# The address other nodes reach this one at. Empty: Ray picks the interface of the default route.
RAY_NODE_IP="${RAY_NODE_IP:-}"
# Resources this node announces. Empty: Ray detects CPUs and GPUs itself. RAY_RESOURCES is JSON,
# e.g. '{"slot": 8}' for custom resources.
RAY_NUM_CPUS="${RAY_NUM_CPUS:-}"
RAY_NUM_GPUS="${RAY_NUM_GPUS:-}"
RAY_RESOURCES="${RAY_RESOURCES:-}"
RAY_OBJECT_STORE_MEMORY="${RAY_OBJECT_STORE_MEMORY:-}"
RAY_INCLUDE_DASHBOARD="${RAY_INCLUDE_DASHBOARD:-true}"
# 1: stay in the foreground (`ray start --block`) - what SLURM steps, containers and tests need;
# stopping this process (or its process group) stops this node. 0: start in the background.
RAY_BLOCK="${RAY_BLOCK:-0}"
# Anything else for `ray start`, split on spaces, e.g. RAY_EXTRA_ARGS="--labels={\"zone\":\"a\"}".
RAY_EXTRA_ARGS="${RAY_EXTRA_ARGS:-}"

# --- the training job's shared storage -------------------------------------------------------------
# A directory every node mounts at the same path (NFS, Lustre, a PVC ...). Checkpoints and the
# locally built models go there; `stapo doctor` verifies that every node sees the same files.
STAPO_CHECKPOINT_DIR="${STAPO_CHECKPOINT_DIR:-}"

# --- collective communication (NCCL for GPUs, gloo for CPU groups) ---------------------------------
# Exported before `ray start`, these reach every Ray worker on this node. Set them the same way on
# every node. See launch/README.md for what each one does.
#   NCCL_SOCKET_IFNAME   interface(s) for NCCL's bootstrap/socket traffic, e.g. "eth0", "ib0", "^lo,docker"
#   GLOO_SOCKET_IFNAME   interface for gloo (torch.distributed CPU groups), a single name, e.g. "eth0"
#   NCCL_IB_HCA          InfiniBand/RoCE adapters to use, e.g. "mlx5_0,mlx5_1" or "^mlx5_bond"
#   NCCL_IB_DISABLE      1 disables InfiniBand (falls back to sockets)
#   NCCL_IB_GID_INDEX    RoCE v2 usually needs 3
#   NCCL_NET_GDR_LEVEL / NCCL_IB_TIMEOUT / NCCL_DEBUG   tuning and diagnosis
STAPO_NET_VARS=(NCCL_SOCKET_IFNAME GLOO_SOCKET_IFNAME NCCL_IB_HCA NCCL_IB_DISABLE NCCL_IB_GID_INDEX
  NCCL_IB_TIMEOUT NCCL_NET_GDR_LEVEL NCCL_DEBUG)

# Names of this node's network interfaces, space-separated.
stapo_ifnames() {
  local path out=()
  for path in /sys/class/net/*; do
    [[ -e "$path" ]] && out+=("${path##*/}")
  done
  echo "${out[*]}"
}

stapo_log() {
  printf '[stapo-ray %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2
}

stapo_die() {
  stapo_log "error: $*"
  exit 1
}

# True when an interface spec (NCCL syntax: comma list, optional leading ^ to exclude, = for exact
# names, otherwise prefixes) selects at least one interface of this node.
stapo_ifname_matches() {
  local spec="$1" exact=0 names ifname entry
  [[ "$spec" == ^* ]] && return 0 # an exclusion list leaves the other interfaces
  if [[ "$spec" == =* ]]; then
    exact=1
    spec="${spec#=}"
  fi
  [[ -d /sys/class/net ]] || return 0 # cannot tell here
  names="$(stapo_ifnames)"
  IFS=',' read -ra entries <<<"$spec"
  for entry in "${entries[@]}"; do
    for ifname in $names; do
      if ((exact)); then
        [[ "$ifname" == "$entry" ]] && return 0
      else
        [[ "$ifname" == "$entry"* ]] && return 0
      fi
    done
  done
  return 1
}

stapo_check_network() {
  local var
  for var in NCCL_SOCKET_IFNAME GLOO_SOCKET_IFNAME; do
    if [[ -n "${!var:-}" ]] && ! stapo_ifname_matches "${!var}"; then
      stapo_die "$var=${!var} matches no network interface of $(hostname) ($(stapo_ifnames)); set it to this node's cluster interface"
    fi
  done
  for var in "${STAPO_NET_VARS[@]}"; do
    if [[ -n "${!var:-}" ]]; then
      export "${var?}"
      stapo_log "$var=${!var}"
    fi
  done
}

stapo_check_shared_dir() {
  if [[ -z "$STAPO_CHECKPOINT_DIR" ]]; then
    stapo_log "STAPO_CHECKPOINT_DIR is not set: multi-node runs need trainer.default_local_dir on storage every node shares"
    return 0
  fi
  mkdir -p "$STAPO_CHECKPOINT_DIR" || stapo_die "cannot create STAPO_CHECKPOINT_DIR=$STAPO_CHECKPOINT_DIR on $(hostname)"
  [[ -w "$STAPO_CHECKPOINT_DIR" ]] || stapo_die "STAPO_CHECKPOINT_DIR=$STAPO_CHECKPOINT_DIR is not writable on $(hostname)"
  export STAPO_CHECKPOINT_DIR
  # the locally built models (stapo://tiny, stapo://smollm2) are built by the driver and read by the
  # workers: keep them on the shared storage too unless the user chose a place
  export STAPO_CACHE="${STAPO_CACHE:-$STAPO_CHECKPOINT_DIR/.stapo-cache}"
  stapo_log "shared checkpoint dir: $STAPO_CHECKPOINT_DIR (STAPO_CACHE=$STAPO_CACHE)"
}

# Ray's token authentication (on by default for new clusters in recent Ray). Every node, every driver
# and `ray job submit` need the cluster's token: ~/.ray/auth_token (fine when home is shared),
# RAY_AUTH_TOKEN_PATH, or RAY_AUTH_TOKEN. RAY_AUTH_MODE=disabled opts out (trusted networks only).
stapo_token_available() {
  [[ -n "${RAY_AUTH_TOKEN:-}" ]] || [[ -n "${RAY_AUTH_TOKEN_PATH:-}" && -s "${RAY_AUTH_TOKEN_PATH:-}" ]] ||
    [[ -s "$HOME/.ray/auth_token" ]]
}

# role: head (creates a token when there is none) or client (worker node, submitter).
stapo_setup_auth() {
  local role="$1"
  if [[ "${RAY_AUTH_MODE:-}" == disabled ]]; then
    stapo_log "RAY_AUTH_MODE=disabled: anyone who reaches the cluster's ports can run code on it"
    return 0
  fi
  if ! stapo_token_available; then
    if [[ "$role" == head && -z "${RAY_AUTH_MODE:-}" ]]; then
      ray get-auth-token --generate >/dev/null || stapo_die "could not create a Ray auth token"
      stapo_log "created a Ray auth token in ~/.ray/auth_token: copy it to the other nodes unless home is shared"
    elif [[ "${RAY_AUTH_MODE:-}" == token || "$role" == head ]]; then
      stapo_die "RAY_AUTH_MODE=token but no token: copy the head's ~/.ray/auth_token here, or set RAY_AUTH_TOKEN / RAY_AUTH_TOKEN_PATH"
    else
      return 0 # no token anywhere: a cluster without authentication
    fi
  fi
  export RAY_AUTH_MODE=token
}

# Fills the array RAY_ARGS with the options common to head and worker nodes.
stapo_common_ray_args() {
  RAY_ARGS=(--temp-dir "$RAY_TEMP_DIR" --disable-usage-stats
    --dashboard-agent-listen-port "$RAY_DASHBOARD_AGENT_LISTEN_PORT")
  [[ -n "$RAY_NODE_IP" ]] && RAY_ARGS+=(--node-ip-address "$RAY_NODE_IP")
  [[ -n "$RAY_NUM_CPUS" ]] && RAY_ARGS+=(--num-cpus "$RAY_NUM_CPUS")
  [[ -n "$RAY_NUM_GPUS" ]] && RAY_ARGS+=(--num-gpus "$RAY_NUM_GPUS")
  [[ -n "$RAY_RESOURCES" ]] && RAY_ARGS+=(--resources "$RAY_RESOURCES")
  [[ -n "$RAY_OBJECT_STORE_MEMORY" ]] && RAY_ARGS+=(--object-store-memory "$RAY_OBJECT_STORE_MEMORY")
  [[ -n "$RAY_NODE_MANAGER_PORT" ]] && RAY_ARGS+=(--node-manager-port "$RAY_NODE_MANAGER_PORT")
  [[ -n "$RAY_OBJECT_MANAGER_PORT" ]] && RAY_ARGS+=(--object-manager-port "$RAY_OBJECT_MANAGER_PORT")
  [[ -n "$RAY_DASHBOARD_AGENT_GRPC_PORT" ]] && RAY_ARGS+=(--dashboard-agent-grpc-port "$RAY_DASHBOARD_AGENT_GRPC_PORT")
  [[ -n "$RAY_METRICS_EXPORT_PORT" ]] && RAY_ARGS+=(--metrics-export-port "$RAY_METRICS_EXPORT_PORT")
  [[ -n "$RAY_RUNTIME_ENV_AGENT_PORT" ]] && RAY_ARGS+=(--runtime-env-agent-port "$RAY_RUNTIME_ENV_AGENT_PORT")
  [[ -n "$RAY_MIN_WORKER_PORT" ]] && RAY_ARGS+=(--min-worker-port "$RAY_MIN_WORKER_PORT")
  [[ -n "$RAY_MAX_WORKER_PORT" ]] && RAY_ARGS+=(--max-worker-port "$RAY_MAX_WORKER_PORT")
  [[ "$RAY_BLOCK" == 1 ]] && RAY_ARGS+=(--block)
  if [[ -n "$RAY_EXTRA_ARGS" ]]; then
    local extra
    read -ra extra <<<"$RAY_EXTRA_ARGS"
    RAY_ARGS+=("${extra[@]}")
  fi
  return 0
}
