#!/usr/bin/env bash
# The real verl trainer on a CPU with the tiny local model: Ray, FSDP2 over gloo, HF rollout, STAPO.
#   ALGO=entropy20 bash recipe/stapo/run_tiny_cpu.sh trainer.total_training_steps=5
set -euo pipefail
cd "$(dirname "$0")/../.."
exec python -m recipe.stapo.main_stapo model_preset=tiny algo="${ALGO:-stapo}" "$@"
