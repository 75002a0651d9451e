#!/usr/bin/env bash
# Build the wheels the CUDA engine check brings to a GPU machine that has torch and CUDA but no verl stack, and
# check that the working tree plus the wheels stays within what such a machine receives (64 MiB).
#
#   bash launch/cuda_check/build_bundle.sh            # wheels for the lent machine's Python (3.12) in wheels/
#   PYTHON_VERSION=3.11 bash launch/cuda_check/build_bundle.sh   # for another Python (this machine's, to try it)
#
# What is bundled: what the engine check imports that the lent GPU image lacks, or holds at a version outside
# the project's pins (its transformers 5.17 / tokenizers 0.23 are above verl 0.9.1's transformers<5.11), at the
# versions of requirements/constraints-cpu.txt. Not bundled: torch (the machine's own CUDA build), Ray and vLLM
# (compiled and larger than the whole budget: the check stubs Ray and runs without vLLM), and what the lent image
# already has (run.sh's HOST_MODULES: numpy, pandas, pyarrow, safetensors, huggingface_hub, peft, accelerate, ...;
# run.sh refuses to start, naming them, where one is missing). Compiled wheels (tensordict, orjson, pydantic-core)
# are for CPython $PYTHON_VERSION on manylinux x86_64; tokenizers is abi3 (CPython 3.9 and later).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
WHEELS="${WHEELS:-$HERE/wheels}"
PYTHON_VERSION="${PYTHON_VERSION:-3.12}"
PYTHON="${PYTHON:-python3}"
LIMIT_BYTES=$((64 * 1024 * 1024))

# name==version of each wheel; one line each (the versions of requirements/constraints-cpu.txt)
PURE=(
  verl==0.9.1
  hydra-core==1.3.8
  omegaconf==2.3.1
  codetiming==1.4.0
  pyvers==0.1.0
  transformers==5.10.4
  datasets==5.2.0
  multiprocess==0.70.19
  dill==0.4.1
  uvicorn==0.54.0
  fastapi==0.136.3
  starlette==1.10.0
  annotated-doc==0.0.7
  pydantic==2.14.3
  typing-inspection==0.4.5
  annotated-types==0.8.0
)
COMPILED=(
  tensordict==0.10.0
  tokenizers==0.22.2
  orjson==3.13.0
  pydantic-core==2.50.4
)
# published as a source archive only: built here into a pure-Python wheel
SOURCE_ONLY=(antlr4-python3-runtime==4.9.3)

PLATFORMS=()
for tag in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
  manylinux2014_x86_64 manylinux1_x86_64; do
  PLATFORMS+=(--platform "$tag")
done

rm -rf "$WHEELS"
mkdir -p "$WHEELS"
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --dest "$WHEELS" "${PURE[@]}"
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --dest "$WHEELS" \
  --python-version "$PYTHON_VERSION" --implementation cp "${PLATFORMS[@]}" "${COMPILED[@]}"
"$PYTHON" -m pip wheel --quiet --no-deps --wheel-dir "$WHEELS" "${SOURCE_ONLY[@]}"

# transformers without the modelling code of the families the check never loads: its models/ folder is 8.9 of its 10.6 MB (480
# families) and the working tree leaves about 16 MiB (FULL_TRANSFORMERS=1 keeps the wheel whole). The kept files
# are byte for byte the published ones; the wheel's RECORD lists them alone, so pip installs it as any wheel.
# transformers finds its model families by listing models/ (its lazy import structure), so the others are absent.
# (auto, qwen3: the check's model; qwen2, llama, mistral, bloom, encoder_decoder: imported by verl or by
# transformers' auto classes on the import chain, found by running the check in a venv that had only these)
TRANSFORMERS_MODELS="${TRANSFORMERS_MODELS:-auto qwen3 qwen2 llama mistral bloom encoder_decoder}"
if [ "${FULL_TRANSFORMERS:-0}" != 1 ]; then
  "$PYTHON" - "$WHEELS"/transformers-*.whl "$TRANSFORMERS_MODELS" <<'SLIM'
import os
import sys
import zipfile

path, keep = sys.argv[1], set(sys.argv[2].split())
slim = path + ".slim"


def kept(name):
    parts = name.split("/")
    if parts[:2] != ["transformers", "models"] or len(parts) < 4 or parts[2] in keep:
        return True
    # every family's package and configuration stay: verl lists auto classes' mappings, which load each config
    return len(parts) == 4 and (parts[3] == "__init__.py" or parts[3].startswith("configuration_"))


with zipfile.ZipFile(path) as src, zipfile.ZipFile(slim, "w", zipfile.ZIP_DEFLATED) as dst:
    record = next(i.filename for i in src.infolist() if i.filename.endswith(".dist-info/RECORD"))
    for info in src.infolist():
        if not kept(info.filename):
            continue
        data = src.read(info)
        if info.filename == record:
            lines = data.decode().splitlines()
            data = ("\n".join(line for line in lines if kept(line.split(",")[0])) + "\n").encode()
        dst.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)
os.replace(slim, path)
SLIM
fi

expected=$((${#PURE[@]} + ${#COMPILED[@]} + ${#SOURCE_ONLY[@]}))
found=$(find "$WHEELS" -maxdepth 1 -name '*.whl' | wc -l)
if [ "$found" -ne "$expected" ]; then
  echo "build_bundle: expected $expected wheels in $WHEELS, found $found" >&2
  exit 1
fi

# what travels: the tracked files and the untracked ones git does not ignore, plus the wheels
cd "$REPO"
# (a tracked file deleted in the working tree does not travel: stat skips it)
tree_bytes=$({ git ls-files -z --cached --others --exclude-standard | xargs -0 stat -c %s 2>/dev/null || true; } \
  | awk '{s += $1} END {print s + 0}')
wheel_bytes=$(find "$WHEELS" -maxdepth 1 -name '*.whl' -print0 | xargs -0 stat -c %s | awk '{s += $1} END {print s + 0}')
total=$((tree_bytes + wheel_bytes))
mib() { awk -v b="$1" 'BEGIN {printf "%.1f MiB", b / 1048576}'; }
echo "build_bundle: $found wheels for CPython $PYTHON_VERSION in $WHEELS: $(mib "$wheel_bytes");" \
  "working tree $(mib "$tree_bytes"); together $(mib "$total") of $(mib "$LIMIT_BYTES")"
if [ "$total" -gt "$LIMIT_BYTES" ]; then
  echo "build_bundle: the working tree plus the wheels is $(mib "$total"), over the $(mib "$LIMIT_BYTES") a GPU" \
    "machine receives: archive results elsewhere or bundle less" >&2
  exit 1
fi
