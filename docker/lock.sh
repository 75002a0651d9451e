#!/usr/bin/env bash
# Writes the image's locks from docker/lock/image.in with uv's resolver (the project's test extra), from
# the package index's metadata; nothing is installed. Every package pinned with its hashes:
#   py311.txt       the image on the stand-in base (Debian 12: Python 3.11, glibc 2.36)
#   py312.txt       the image on verl's base (Ubuntu 24.04: Python 3.12, glibc 2.39)
#   base-py311.txt  the stand-in base: torch, vLLM and what they need, at py311.txt's versions
# Every package the CPU suite also installs is held at requirements/constraints-cpu.txt's version, so the image
# runs what the tests ran, except those the image must take from its own stack (IMAGE_OWN):
#   torch, triton                the CUDA build of 2.11.0 (the CPU suite has 2.13.0's CPU build)
#   transformers                 verl[vllm]'s 5.9.0 (vLLM's CPU build needs 5.10.4)
#   vllm, apache-tvm-ffi, xgrammar   vLLM 0.24 pins apache-tvm-ffi 0.1.9; the CPU suite's xgrammar needs newer
# Run from the repository root after changing image.in, pyproject.toml's dependencies or the CPU pins; commit
# the result. tests/launch/test_image_lock.py keeps the three in step.
set -euo pipefail
cd "$(dirname "$0")/.."
UV="${UV:-.venv/bin/uv}"
IMAGE_OWN='torch|triton|transformers|vllm|apache-tvm-ffi|xgrammar'
cpu_pins="$(mktemp)"
trap 'rm -f "$cpu_pins"' EXIT
grep -E '^[A-Za-z0-9][A-Za-z0-9._-]*==' requirements/constraints-cpu.txt | grep -viE "^($IMAGE_OWN)==" >"$cpu_pins"
compile() {  # compile PYTHON PLATFORM OUT [extra args]
  local python="$1" platform="$2" out="$3"; shift 3
  "$UV" pip compile --quiet --no-config --no-python-downloads --generate-hashes --no-emit-package stapo \
    --custom-compile-command "make image-lock" \
    --python-version "$python" --python-platform "$platform" "$@" -o "$out"
}
compile 3.11 x86_64-manylinux_2_36 docker/lock/py311.txt docker/lock/image.in -c "$cpu_pins"
compile 3.12 x86_64-manylinux_2_39 docker/lock/py312.txt docker/lock/image.in -c "$cpu_pins"
grep -E '^(torch|vllm)==' docker/lock/image.in \
  | compile 3.11 x86_64-manylinux_2_36 docker/lock/base-py311.txt - -c docker/lock/py311.txt
# the annotations name the CPU pins by their file, not the temporary copy
sed -i "s#$cpu_pins#requirements/constraints-cpu.txt#" docker/lock/py311.txt docker/lock/py312.txt
