#!/usr/bin/env bash
# SkyPilot's setup step (launch/skypilot/stapo.yaml), run once per node inside the project's image
# (docker/Dockerfile, resources.image_id). Nothing is installed here: the image holds verl, vLLM
# and stapo; this only proves that the node is what the job expects before any GPU hour is spent.
set -euo pipefail
for tool in ray stapo python3; do
  command -v "$tool" >/dev/null || {
    echo "setup: '$tool' is not on PATH: is resources.image_id the stapo image (docker/README.md)?" >&2
    exit 1
  }
done
python3 - <<'PY'
from importlib.metadata import version

import verl  # noqa: F401  (loads the verl.plugins entry point, as every Ray worker will)
from stapo.verl_plugin.registration import assert_registered

assert_registered()
print("setup: verl", version("verl"), "torch", version("torch"), "stapo", version("stapo"), "- STAPO registered")
PY
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || echo "setup: nvidia-smi failed: no GPU visible" >&2
