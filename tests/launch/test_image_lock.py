"""The image's locks (docker/lock/, written by `make image-lock`) agree with what they lock.

The image build installs every package at its locked version and hash with no resolution (docker/install_lock.py),
so a lock that drifts from pyproject.toml, the Dockerfile's versions or the CPU suite's pins would ship unseen: the
build only sees that the lock installs. These checks read the files; the last one asks the package index whether
the lock is still one resolution of docker/lock/image.in.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[2]
LOCKS = REPO / "docker" / "lock"
sys.path.insert(0, str(REPO / "docker"))
from install_lock import HELD, lock_entries, locked_version, normalise  # noqa: E402

IMAGE_LOCKS = ("py311.txt", "py312.txt")
# what the image takes from its own stack rather than the CPU suite's pins (docker/lock.sh says why)
IMAGE_OWN = {"torch", "triton", "transformers", "vllm", "apache-tvm-ffi", "xgrammar"}


def pins(name: str) -> dict[str, str]:
    return versions((LOCKS / name).read_text())


def versions(lock_text: str) -> dict[str, str]:
    return {name: locked_version(entry) for name, entry in lock_entries(lock_text).items()}


def image_in() -> dict[str, str]:
    lines = (LOCKS / "image.in").read_text().splitlines()
    return {normalise(line.split("==")[0]): line.split("==")[1] for line in lines if "==" in line}


def cpu_pins() -> dict[str, str]:
    found = {}
    for line in (REPO / "requirements" / "constraints-cpu.txt").read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;#]+)", line)
        if match:
            found[normalise(match.group(1))] = match.group(2)
    return found


def dockerfile_versions() -> dict[str, str]:
    text = (REPO / "docker" / "Dockerfile").read_text()
    args = dict(re.findall(r"^ARG (\w+)=(\S+)$", text, flags=re.M))
    labels = dict(re.findall(r'org\.stapo\.version\.(torch|vllm)="([^"]+)"', text))
    return {"verl": args["VERL_VERSION"], "transformers": args["TRANSFORMERS_VERSION"],
            "transferqueue": args["TRANSFER_QUEUE_VERSION"], **labels}


@pytest.mark.parametrize("lock", IMAGE_LOCKS)
def test_each_lock_pins_the_dockerfiles_versions_and_image_in(lock):
    locked, wanted = pins(lock), image_in()
    assert wanted == dockerfile_versions()
    assert {name: locked.get(name) for name in wanted} == wanted


@pytest.mark.parametrize("lock", IMAGE_LOCKS)
def test_each_lock_satisfies_every_dependency_of_pyproject(lock):
    locked = pins(lock)
    for dependency in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]:
        requirement = Requirement(dependency)
        name = normalise(requirement.name)
        assert name in locked, f"{lock} lacks {requirement}"
        assert requirement.specifier.contains(locked[name], prereleases=True), (lock, str(requirement), locked[name])


@pytest.mark.parametrize("lock", IMAGE_LOCKS)
def test_the_image_runs_the_cpu_suites_versions_but_for_its_own_stack(lock):
    locked, cpu = pins(lock), cpu_pins()
    differ = {name for name in set(locked) & set(cpu) if locked[name] != cpu[name]}
    assert differ <= IMAGE_OWN, f"{lock} differs from requirements/constraints-cpu.txt in {sorted(differ - IMAGE_OWN)}"


@pytest.mark.parametrize("lock", IMAGE_LOCKS)
def test_every_locked_package_has_a_hash(lock):
    entries = lock_entries((LOCKS / lock).read_text())
    assert len(entries) > 200
    bare = [name for name, entry in entries.items() if not re.search(r"--hash=sha256:[0-9a-f]{64}", entry)]
    assert not bare, bare


def test_the_stand_in_base_is_the_image_locks_torch_and_vllm_part():
    base, image = lock_entries((LOCKS / "base-py311.txt").read_text()), lock_entries((LOCKS / "py311.txt").read_text())
    assert {"torch", "vllm"} <= set(base) and set(base) < set(image)
    # the same versions and the same hashes: the base is the image's lock, cut down
    assert {name: image[name] for name in base} == base
    # every CUDA-side package the base brings is one the image holds rather than reinstalls
    assert {name for name in base if name.startswith("nvidia-")} <= {name for name in base if HELD.match(name)}


def test_lock_entries_reads_a_multi_line_entry_and_skips_comments():
    text = ("# header\nfoo-Bar==1.0 \\\n    --hash=sha256:" + "a" * 64
            + "\n    # via x\nbaz==2 \\\n    --hash=sha256:b\n")
    assert lock_entries(text) == {"foo-bar": "foo-Bar==1.0 \\\n    --hash=sha256:" + "a" * 64,
                                  "baz": "baz==2 \\\n    --hash=sha256:b"}


@pytest.mark.slow  # asks the package index (metadata only)
def test_the_lock_is_still_a_resolution_of_image_in(tmp_path):
    """``uv pip compile`` of image.in, held to py311.txt's versions, picks exactly py311.txt's packages: a
    dependency added to pyproject.toml without `make image-lock` shows as a package the lock lacks."""
    uv = Path(sys.executable).parent / "uv"
    out = tmp_path / "again.txt"
    done = subprocess.run(
        [str(uv), "pip", "compile", "--quiet", "--no-config", "--no-python-downloads", "--no-emit-package", "stapo",
         "--python-version", "3.11", "--python-platform", "x86_64-manylinux_2_36", str(LOCKS / "image.in"),
         "-c", str(LOCKS / "py311.txt"), "-o", str(out)],
        capture_output=True, text=True, timeout=600, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    assert versions(out.read_text()) == pins("py311.txt")
