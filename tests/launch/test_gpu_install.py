"""What a GPU user installs resolves: the ``gpu`` extra, the image's install, and an install into an environment
that already holds verl 0.9.1 with its vLLM extra.

None of it can be installed here (CUDA wheels, no GPU), but every package set can be resolved for the image's
platform (Python 3.12, manylinux x86-64) from the package index's published metadata, by uv's resolver
(``uv pip compile --python-platform``), which reads wheels' metadata without installing them and builds only
the metadata of the few source-only packages. A pin that contradicts another package's requirement fails
here, as ``transformers>=5.10`` against verl[vllm]'s ``transformers==5.9.0`` did.

Needs the package index (CI has it); nothing is downloaded but metadata.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "docker" / "Dockerfile"
# the base image's Python and platform (Ubuntu 24.04: glibc 2.39)
PYTHON, PLATFORM = "3.12", "x86_64-manylinux_2_28"

pytestmark = pytest.mark.slow


def uv() -> str:
    found = shutil.which("uv", path=str(Path(sys.executable).parent))
    assert found, "uv is not in the venv: it is in the project's test extra (pip install -e '.[test]')"
    return found


def image_versions() -> dict[str, str]:
    """The Dockerfile's ARGs and the base image's versions its labels record (torch, vLLM)."""
    text = DOCKERFILE.read_text(encoding="utf-8")
    found = dict(re.findall(r"^ARG (\w+)=(\S+)$", text, flags=re.M))
    found.update(re.findall(r'org\.stapo\.version\.(torch|vllm)="([^"]+)"', text))
    return found


def compile_lock(tmp: Path, name: str, requirements: list[str], constraints: Path | None = None):
    """``uv pip compile`` of ``requirements`` for the image's platform into ``tmp/name.txt``."""
    source = tmp / f"{name}.in"
    source.write_text("\n".join(requirements) + "\n")
    argv = [uv(), "pip", "compile", "--no-config", "--no-python-downloads", "--python-version", PYTHON,
            "--python-platform", PLATFORM, "--no-header", "--no-annotate", "--quiet", str(source),
            "-o", str(tmp / f"{name}.txt")]
    if constraints is not None:
        argv += ["-c", str(constraints)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=900, cwd=REPO)


def resolve(tmp: Path, name: str, requirements: list[str], constraints: Path | None = None) -> dict[str, str]:
    """``name==version`` of every package a resolution for the image's platform picks (normalised names)."""
    done = compile_lock(tmp, name, requirements, constraints)
    assert done.returncode == 0, f"{name} does not resolve:\n{done.stderr[-3000:]}"
    return parse_lock((tmp / f"{name}.txt").read_text())


def parse_lock(text: str) -> dict[str, str]:
    """A lock's ``name==version`` lines; a direct reference (``stapo @ file:///...``) maps to its URL."""
    pins = {}
    for line in text.splitlines():
        line = line.split(";")[0].strip()
        if not line or line.startswith(("#", "-")):
            continue
        name, version = line.split(" @ ") if " @ " in line else line.split("==")
        pins[re.sub(r"[-_.]+", "-", name).lower()] = version
    return pins


def as_constraints(tmp: Path, pins: dict[str, str]) -> Path:
    """An environment's versions as a constraints file, as ``pip list --format=freeze`` writes them."""
    path = tmp / "existing-env.txt"
    path.write_text("".join(f"{name}=={version}\n" for name, version in pins.items()))
    return path


@pytest.fixture(scope="module")
def verl_gpu_env(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """What ``pip install "verl[vllm]==0.9.1"`` puts into a fresh Python 3.12 environment: the shared cluster's
    existing verl install."""
    tmp = tmp_path_factory.mktemp("locks")
    return tmp, resolve(tmp, "verl-vllm", ["verl[vllm]==0.9.1"])


def test_the_gpu_extra_resolves_to_the_images_stack(tmp_path):
    pins = resolve(tmp_path, "gpu-extra", [f"stapo[gpu] @ {REPO.as_uri()}"])
    image = image_versions()
    assert pins["verl"] == image["VERL_VERSION"]
    assert pins["torch"] == image["torch"] and pins["vllm"] == image["vllm"]
    # the transformers line the image takes is the one verl's vLLM extra pins
    assert pins["transformers"] == image["TRANSFORMERS_VERSION"]


def test_the_images_install_resolves_with_the_base_images_torch_and_vllm(tmp_path):
    """The Dockerfile's RUN: verl, transformers, TransferQueue and this project at its ARGs, the base image's torch
    and vLLM held where they are."""
    image = image_versions()
    held = [f"torch=={image['torch']}", f"vllm=={image['vllm']}"]
    installs = [f"verl=={image['VERL_VERSION']}", f"transformers=={image['TRANSFORMERS_VERSION']}",
                f"TransferQueue=={image['TRANSFER_QUEUE_VERSION']}", f"stapo @ {REPO.as_uri()}"]
    pins = resolve(tmp_path, "image", held + installs)
    for requirement in held + installs[:-1]:
        req = Requirement(requirement)
        assert req.specifier.contains(pins[req.name.lower()]), (requirement, pins[req.name.lower()])


def test_installing_into_an_existing_verl_gpu_environment_moves_none_of_its_packages(verl_gpu_env):
    """docker/README.md's install for a machine that has verl 0.9.1 with its vLLM extra: the environment's own
    versions as constraints, then this project. It must resolve, and every package already there keeps its
    version; what is added is this project's own needs."""
    tmp, existing = verl_gpu_env
    constraints = as_constraints(tmp, existing)
    after = resolve(tmp, "with-stapo", ["verl[vllm]==0.9.1", f"stapo @ {REPO.as_uri()}"], constraints)
    moved = {name: (version, after.get(name)) for name, version in existing.items() if after.get(name) != version}
    assert not moved, f"installing stapo would change these packages of verl's environment: {moved}"
    assert after["stapo"] == REPO.as_uri() and set(existing) < set(after)


def test_a_pin_that_contradicts_verls_is_refused_by_the_resolution(verl_gpu_env):
    """The check is not vacuous: the project's former ``transformers>=5.10`` cannot join verl's environment."""
    tmp, existing = verl_gpu_env
    constraints = as_constraints(tmp, existing)
    done = compile_lock(tmp, "contradiction", ["verl[vllm]==0.9.1", "transformers>=5.10,<5.11"], constraints)
    assert done.returncode != 0 and "transformers" in done.stderr
