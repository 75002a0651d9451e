#!/usr/bin/env bash
# Runs a built image the way a cluster user does, on this machine's CPU (no GPU needed):
#   docker/image_test.sh IMAGE        (make image-test)
# 1. docker/check_image.py inside the image, as its non-root user, against the lock;
# 2. `stapo check` accepts every GPU preset (qwen3_*) and refuses three mistakes in one line each;
# 3. two STAPO steps of the `tiny` preset train (HF rollout server, gloo) into a run folder on a volume
#    mounted from this host, which the host then reads;
# 4. the entrypoint's head and worker modes make a two-node Ray cluster, `stapo doctor` on it says in one
#    line that there is no GPU, a job submitted in submit mode runs on it, and both nodes stop.
# Every Ray address is loopback. Each step prints its time; the first failure stops the script (exit 1).
set -euo pipefail
cd "$(dirname "$0")/.."
IMAGE="${1:?usage: docker/image_test.sh IMAGE}"
engine=docker/engine.sh
work="$(mktemp -d /tmp/stapo-image-test.XXXXXX)"
containers=()
cleanup() {
  for name in "${containers[@]}"; do "$engine" rm -f -t 5 "$name" >/dev/null 2>&1 || true; done
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "image-test: FAILED: $*" >&2; exit 1; }
step() { echo "image-test: $*"; STEP_START=$SECONDS; }
done_step() { echo "image-test: ok ($((SECONDS - STEP_START)) s)"; }
label() { "$engine" image inspect --format "{{ index .Config.Labels \"org.stapo.version.$1\" }}" "$IMAGE"; }
run() { "$engine" run --rm --network host --shm-size 4g "$@"; }

step "the image's own check, as its non-root user"
# shellcheck disable=SC2016  # the script runs inside the image
run "$IMAGE" bash -c 'test "$(id -u)" != 0 || { echo "runs as root"; exit 1; }
  python3 /opt/stapo/docker/check_image.py --verl "$1" --transformers "$2" --transfer-queue "$3" --lock auto' \
  _ "$(label verl)" "$(label transformers)" "$(label transferqueue)" || fail "check_image.py"
done_step

step "stapo check: every GPU preset accepted, three mistakes refused in one line each"
# shellcheck disable=SC2016  # the script runs inside the image
run "$IMAGE" bash -c '
  cd /opt/stapo
  for file in conf/model_preset/qwen3_*.yaml; do
    preset="$(basename "$file" .yaml)"
    stapo check --no-paths "model_preset=$preset" >/dev/null 2>/tmp/err || { cat /tmp/err; echo "refused: $preset"; exit 1; }
    echo "accepted: $preset"
  done
  for mistake in "model_preset=qwen3_8b algo=stapo_typo" "model_preset=qwen3_8b actor_rollout_ref.actor.optim.lr=-1" \
      "model_preset=qwen3_8b_1node data.max_response_length=0"; do
    # shellcheck disable=SC2086
    if stapo check --no-paths $mistake >/dev/null 2>/tmp/err; then echo "accepted: $mistake"; exit 1; fi
    grep -v -e "^WARNING" -e "^$" /tmp/err >/tmp/said
    [ "$(wc -l </tmp/said)" = 1 ] || { cat /tmp/err; echo "not one line: $mistake"; exit 1; }
    echo "refused: $mistake: $(cut -c1-120 /tmp/said)"
  done' || fail "stapo check"
done_step

step "two STAPO steps of the tiny preset on the CPU, the run folder on a mounted volume"
mkdir -p "$work/runs" && chown 1000:1000 "$work/runs"
run -v "$work/runs:/runs" "$IMAGE" train model_preset=tiny algo=stapo trainer.total_training_steps=2 \
  trainer.save_freq=-1 'trainer.logger=[console]' stapo.run_dir=/runs/tiny >"$work/train.log" 2>&1 \
  || { tail -40 "$work/train.log"; fail "training in the image"; }
metrics="$work/runs/tiny/metrics.jsonl"
[ -r "$metrics" ] || { ls -lR "$work/runs"; fail "no metrics.jsonl on the host"; }
python3 - "$metrics" <<'PY' || fail "the run folder's metrics"
import json, sys
steps = [json.loads(line).get("step") for line in open(sys.argv[1]) if line.strip()]
assert steps[-2:] == [1, 2], f"steps recorded: {steps}"
print(f"image-test: the host reads {sys.argv[1]}: steps {steps}")
PY
[ "$(stat -c %u "$metrics")" != 0 ] || fail "the run folder is owned by root"
done_step

step "entrypoint head + worker: a two-node Ray cluster on loopback, doctor, a submitted job, stop"
# the cluster's token as a cluster user hands it out: one file, mounted read-only into every container
python3 -c 'import secrets; print(secrets.token_hex(32))' >"$work/ray_token" && chmod 0644 "$work/ray_token"
mkdir -p "$work/shared" && chown 1000:1000 "$work/shared"
ray_env=(-v "$work/shared:/checkpoints" -v "$work/ray_token:/run/stapo/ray_token:ro" -e RAY_AUTH_MODE=token -e RAY_AUTH_TOKEN_PATH=/run/stapo/ray_token
  -e RAY_NODE_IP=127.0.0.1 -e RAY_DASHBOARD_HOST=127.0.0.1 -e RAY_HEAD_PORT=26379 -e RAY_DASHBOARD_PORT=28265
  -e RAY_CLIENT_PORT=20001 -e RAY_NUM_CPUS=2 -e RAY_NUM_GPUS=0)
head="stapo-image-test-head-$$" worker="stapo-image-test-worker-$$"
containers+=("$head" "$worker")
"$engine" run -d --name "$head" --network host --shm-size 2g "${ray_env[@]}" \
  -e RAY_DASHBOARD_AGENT_LISTEN_PORT=52410 -e RAY_MIN_WORKER_PORT=30000 -e RAY_MAX_WORKER_PORT=30099 \
  "$IMAGE" head >/dev/null
nodes() { "$engine" exec "$head" python3 -c 'import ray; ray.init(address="127.0.0.1:26379", logging_level="ERROR")
print(sum(n["Alive"] for n in ray.nodes()))' 2>>"$work/nodes.log" | tail -1; }
wait_nodes() {
  for _ in $(seq 60); do [ "$(nodes)" = "$1" ] && return 0; sleep 3; done
  "$engine" logs "$head" 2>&1 | tail -20; tail -5 "$work/nodes.log"; fail "the cluster did not reach $1 alive node(s)"
}
wait_nodes 1
"$engine" run -d --name "$worker" --network host --shm-size 2g "${ray_env[@]}" -e RAY_HEAD_ADDRESS=127.0.0.1:26379 \
  -e RAY_DASHBOARD_AGENT_LISTEN_PORT=52411 -e RAY_MIN_WORKER_PORT=30100 -e RAY_MAX_WORKER_PORT=30199 \
  "$IMAGE" worker >/dev/null
wait_nodes 2
echo "image-test: head and worker joined: 2 alive nodes"
"$engine" exec "$head" stapo doctor --address 127.0.0.1:26379 >"$work/doctor.log" 2>&1 || true
# no GPU: the one failing check; the shared /checkpoints, the versions, the plugin and vLLM pass on both nodes
grep -q "^\[FAIL\] resources .*no node announces the resource 'GPU'" "$work/doctor.log" \
  || { cat "$work/doctor.log"; fail "stapo doctor did not say in one line that there is no GPU"; }
grep -q "^FAILED: resources$" "$work/doctor.log" || { cat "$work/doctor.log"; fail "stapo doctor failed another check"; }
echo "image-test: stapo doctor: $(grep "^\[FAIL\] resources" "$work/doctor.log" | cut -c1-110)"
# a job through the head's job API: it runs the recipe on the cluster, which refuses the setting in one line
run "${ray_env[@]}" -e RAY_ADDRESS=http://127.0.0.1:28265 -e STAPO_WAIT=1 "$IMAGE" submit model_preset=tiny algo=stapo \
  actor_rollout_ref.actor.optim.lr=-1 >"$work/submit.log" 2>&1 && fail "the submitted job succeeded with lr=-1"
if ! { grep -q "optim.lr must be a finite number" "$work/submit.log" && grep -q "Job .stapo-.* failed" "$work/submit.log"; }; then
  tail -30 "$work/submit.log"; fail "submit: the job's refusal is not in its log"
fi
echo "image-test: the job ran on the cluster and was refused: $(grep -m1 'optim.lr must' "$work/submit.log" | cut -c1-100)"
"$engine" stop -t 30 "$worker" "$head" >/dev/null || fail "stopping the nodes"
for name in "$worker" "$head"; do
  state="$("$engine" inspect --format '{{.State.Status}}' "$name")"
  [ "$state" = exited ] || fail "$name is $state after stop"
done
done_step
echo "image-test: all passed"
