"""The image's build-time check (docker/check_image.py) fails when it should.

The image's build runs it and passes (`make image`, in CI after `make test`); what the build cannot show is
that the check would stop a wrong image, so its failing side runs here, in the CPU venv: a pin the install does
not hold, a missing entrypoint, a lock whose version is not the one installed.
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


@pytest.mark.slow  # starts processes: out of make test-fast
def test_the_image_check_fails_on_a_pin_the_install_does_not_hold_and_on_a_missing_entrypoint():
    done = run_check(*image_argv(**{"--verl": "0.9.0", "--entrypoint": "no-such-entrypoint"}))
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert "check_image: verl 0.9.1 is installed, the image pins 0.9.0" in lines
    assert "check_image: no-such-entrypoint: not on the PATH" in lines
    assert "ok" not in done.stdout


@pytest.mark.slow  # starts processes: out of make test-fast
def test_the_image_check_names_every_package_that_is_not_at_its_locked_version(tmp_path):
    lock = tmp_path / "lock.txt"
    lock.write_text("verl==0.0.1 \\\n    --hash=sha256:" + "0" * 64 + "\nno-such-package==1.0\n")
    done = run_check(*image_argv(), "--lock", str(lock))
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert "check_image: verl 0.9.1 is installed, lock.txt locks 0.0.1" in lines
    assert "check_image: no-such-package None is installed, lock.txt locks 1.0" in lines
