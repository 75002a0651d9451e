#!/usr/bin/env bash
# Submit a STAPO training run to a running Ray cluster as a Ray job.
#   RAY_ADDRESS=http://<head>:8265 bash launch/ray/submit.sh \
#     model_preset=qwen3_8b trainer.nnodes=4 trainer.n_gpus_per_node=8 \
#     trainer.default_local_dir=/shared/stapo/ckpt/qwen3_8b
# Arguments are Hydra overrides of recipe.stapo.main_stapo. Settings (environment):
#   RAY_ADDRESS         the head's dashboard/job API (default http://127.0.0.1:8265)
#   STAPO_WORKING_DIR   uploaded as the job's working directory (default: this repository)
#   STAPO_RUNTIME_ENV   runtime env YAML (default: launch/ray/runtime_env.yaml)
#   STAPO_JOB_ID        submission id (default: stapo-<date>-<random>)
#   STAPO_WAIT          1: stream the logs and exit with the job's result; 0 (default): return at once
#   STAPO_ENTRYPOINT_NUM_CPUS   CPUs reserved for the driver process (default 1)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=launch/ray/common.sh
source "$here/common.sh"

RAY_ADDRESS="${RAY_ADDRESS:-http://127.0.0.1:8265}"
STAPO_WORKING_DIR="${STAPO_WORKING_DIR:-$(cd "$here/../.." && pwd)}"
STAPO_RUNTIME_ENV="${STAPO_RUNTIME_ENV:-$here/runtime_env.yaml}"
STAPO_JOB_ID="${STAPO_JOB_ID:-stapo-$(date +%Y%m%d-%H%M%S)-$RANDOM}"
STAPO_WAIT="${STAPO_WAIT:-0}"
STAPO_ENTRYPOINT_NUM_CPUS="${STAPO_ENTRYPOINT_NUM_CPUS:-1}"

command -v ray >/dev/null || stapo_die "'ray' is not on PATH: activate the environment that has stapo installed"
[[ -f "$STAPO_RUNTIME_ENV" ]] || stapo_die "STAPO_RUNTIME_ENV=$STAPO_RUNTIME_ENV does not exist"
[[ -f "$STAPO_WORKING_DIR/recipe/stapo/main_stapo.py" ]] ||
  stapo_die "STAPO_WORKING_DIR=$STAPO_WORKING_DIR has no recipe/stapo/main_stapo.py (point it at the stapo repository)"
stapo_setup_auth client
export RAY_ADDRESS

# The job's driver joins the running cluster: ray.init must not be given resources then, so unless
# the caller sets them, the presets' ray_kwargs.ray_init.num_cpus/num_gpus are cleared.
overrides=("$@")
for key in num_cpus num_gpus; do
  given=0
  for arg in "$@"; do
    [[ "$arg" == *"ray_kwargs.ray_init.$key="* ]] && given=1
  done
  ((given)) || overrides+=("++ray_kwargs.ray_init.$key=null")
done

submit=(ray job submit --address "$RAY_ADDRESS" --submission-id "$STAPO_JOB_ID"
  --working-dir "$STAPO_WORKING_DIR" --runtime-env "$STAPO_RUNTIME_ENV"
  --entrypoint-num-cpus "$STAPO_ENTRYPOINT_NUM_CPUS")
[[ "$STAPO_WAIT" == 1 ]] || submit+=(--no-wait)

stapo_log "submitting $STAPO_JOB_ID to $RAY_ADDRESS (working dir $STAPO_WORKING_DIR)"
cat >&2 <<MSG
  follow the logs:  ray job logs --address $RAY_ADDRESS --follow $STAPO_JOB_ID
  status:           ray job status --address $RAY_ADDRESS $STAPO_JOB_ID
  stop it:          ray job stop --address $RAY_ADDRESS $STAPO_JOB_ID
  dashboard:        $RAY_ADDRESS
MSG
"${submit[@]}" -- python -m recipe.stapo.main_stapo "${overrides[@]}"
if [[ "$STAPO_WAIT" == 1 ]]; then
  # `ray job submit` exits 0 for a stopped job too: ask for the final status
  status="$(ray job status --address "$RAY_ADDRESS" "$STAPO_JOB_ID" 2>&1 | tail -n 5)"
  if [[ "${status,,}" != *"job '${STAPO_JOB_ID,,}' succeeded"* ]]; then
    stapo_die "job $STAPO_JOB_ID did not succeed: $status"
  fi
  stapo_log "job $STAPO_JOB_ID succeeded"
fi
