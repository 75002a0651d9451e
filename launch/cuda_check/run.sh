#!/usr/bin/env bash
# Run the CUDA engine check on a GPU machine that has torch and CUDA but no verl stack and no network: a venv that
# keeps the machine's torch, the wheels of build_bundle.sh installed offline, then engine_check.py under torchrun.
#
#   bash launch/cuda_check/run.sh                       # 1 GPU; figures in $OUT/cuda_engine_check.json
#   NPROC=2 bash launch/cuda_check/run.sh --algos stapo  # more GPUs; arguments go to engine_check.py
#   DEVICE=cpu PYTHON=python3.11 bash launch/cuda_check/run.sh   # the same path on a CPU (gloo, 1 rank)
#
# Settings (environment): OUT (folder of the JSON; default outputs/cuda_check), DEVICE (cuda | cpu), NPROC (ranks),
# PYTHON (the interpreter holding torch), WHEELS (the bundle), VENV (where the venv is made; replaced each run).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
PYTHON="${PYTHON:-python3}"
WHEELS="${WHEELS:-$HERE/wheels}"
VENV="${VENV:-/tmp/stapo-cuda-check-venv}"
OUT_DIR="${OUT:-$REPO/outputs/cuda_check}"
DEVICE="${DEVICE:-cuda}"
NPROC="${NPROC:-1}"

if ! compgen -G "$WHEELS/*.whl" >/dev/null; then
  echo "run.sh: no wheels in $WHEELS: build them first (bash launch/cuda_check/build_bundle.sh, where pip works)" >&2
  exit 1
fi
# what the bundle does not carry (the lent GPU image has each): refused in one line when one is missing
HOST_MODULES="torch numpy pandas pyarrow xxhash PIL dateutil safetensors huggingface_hub peft accelerate yaml regex tqdm
  psutil packaging cloudpickle importlib_metadata httpx click"
"$PYTHON" - "$HOST_MODULES" <<'CHECK'
import importlib.util
import sys

missing = [name for name in sys.argv[1].split() if importlib.util.find_spec(name) is None]
if missing:
    sys.exit(f"run.sh: {sys.executable} lacks {', '.join(missing)}, which the wheel bundle does not carry "
             "(launch/cuda_check/README.md): install them there, or add their wheels to build_bundle.sh")
CHECK

# the venv sees what PYTHON sees (its torch above all), after its own packages: a .pth file adds PYTHON's site
# folders. Not --system-site-packages: where PYTHON is itself a venv (the lent image's python3 is), that flag
# reaches the base interpreter's packages instead of PYTHON's, and misses the machine's torch.
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
host_sites="$("$PYTHON" -c 'import site; print(" ".join(site.getsitepackages()))')"
venv_site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
for site_dir in $host_sites; do
  echo "import site; site.addsitedir('$site_dir')"
done >"$venv_site/stapo_host_site.pth"

# offline, and without dependencies: verl's list names Ray, vLLM and more that the check does without
"$VENV/bin/python" -m pip install --quiet --no-index --no-deps --no-cache-dir --find-links "$WHEELS" "$WHEELS"/*.whl

mkdir -p "$OUT_DIR"
cd "$REPO"
# the checkout's stapo on the path (engine_check.py registers the plugin itself; nothing is installed from it)
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
"$VENV/bin/python" -m torch.distributed.run --standalone --nproc_per_node="$NPROC" \
  "$HERE/engine_check.py" --device "$DEVICE" --out "$OUT_DIR/cuda_engine_check.json" "$@"
