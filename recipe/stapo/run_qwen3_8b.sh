#!/usr/bin/env bash
# STAPO on Qwen3-8B-Base with the paper's recipe (8 nodes x 8 GPUs, vLLM), from a Ray head node.
# Extra Hydra overrides pass through, e.g.:  ALGO=grpo bash recipe/stapo/run_qwen3_8b.sh trainer.nnodes=4
set -euo pipefail
cd "$(dirname "$0")/../.."
exec python -m recipe.stapo.main_stapo model_preset=qwen3_8b algo="${ALGO:-stapo}" "$@"
