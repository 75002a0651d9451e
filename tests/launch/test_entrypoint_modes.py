"""The image's entrypoint (docker/entrypoint.sh) dispatches each mode to what it names, with its arguments.

The scripts behind ``head``, ``worker`` and ``submit`` are run for real against a loopback cluster in
tests/launch/test_cluster.py; here each mode is run through the entrypoint itself, on the CPU install, up to the
point where it would need a GPU or a running cluster: ``train --cfg job`` composes the recipe's real Hydra config
in ``$STAPO_HOME``, ``doctor --help`` is ``stapo doctor``'s, and ``head``, ``worker`` and ``submit`` stop at
their scripts' own refusals (which name the setting), before any Ray process starts.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ENTRY = REPO / "docker" / "entrypoint.sh"


def entrypoint(*argv: str, cwd: Path, timeout: int = 120, **env: str) -> subprocess.CompletedProcess:
    """The entrypoint as the image runs it: from any directory, the project at ``STAPO_HOME``."""
    environment = {**os.environ, "STAPO_HOME": str(REPO), **env}
    return subprocess.run(["bash", str(ENTRY), *argv], cwd=cwd, env=environment, capture_output=True, text=True,
                          timeout=timeout)


def test_no_mode_is_help(tmp_path):
    bare, asked = entrypoint(cwd=tmp_path), entrypoint("help", cwd=tmp_path)
    assert bare.returncode == 0 and bare.stdout == asked.stdout and "submit [overrides...]" in bare.stdout


@pytest.mark.slow  # starts processes: out of make test-fast
def test_train_composes_the_recipes_config_from_stapo_home(tmp_path):
    done = entrypoint("train", "--cfg", "job", "algo=stapo", "trainer.total_training_steps=7", cwd=tmp_path,
                      timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "token_mask: stapo" in done.stdout and "total_training_steps: 7" in done.stdout
    # the recipe's defaults: the tiny preset on the CPU back-end and its HF rollout
    for text in ("loss_mode: masked_clip", "path: stapo://tiny", "name: stapo_hf", "device: cpu"):
        assert text in done.stdout, text
    assert not any(tmp_path.iterdir()), "--cfg job must only print the config"


def test_doctor_is_stapo_doctor(tmp_path):
    done = entrypoint("doctor", "--help", cwd=tmp_path)
    assert done.returncode == 0 and "usage: stapo doctor" in done.stdout


def test_worker_mode_runs_start_worker_and_its_refusal(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "RAY_HEAD_ADDRESS"}
    done = subprocess.run(["bash", str(ENTRY), "worker"], cwd=tmp_path, env={**env, "STAPO_HOME": str(REPO)},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "set RAY_HEAD_ADDRESS=<head host>:<GCS port>" in done.stderr


def test_head_mode_runs_start_head_and_refuses_a_bad_interface_before_ray(tmp_path):
    ray_tmp = tmp_path / "ray"
    ray_tmp.mkdir()
    done = entrypoint("head", cwd=tmp_path, NCCL_SOCKET_IFNAME="nosuchif0", RAY_TEMP_DIR=str(ray_tmp),
                      RAY_AUTH_MODE="disabled")
    assert done.returncode != 0 and "NCCL_SOCKET_IFNAME=nosuchif0 matches no network interface" in done.stderr
    assert not any(ray_tmp.iterdir()), "Ray must not have started"


def test_submit_mode_runs_submit_sh_with_its_settings(tmp_path):
    missing = tmp_path / "no_runtime_env.yaml"
    done = entrypoint("submit", "algo=stapo", cwd=tmp_path, STAPO_RUNTIME_ENV=str(missing))
    assert done.returncode != 0 and f"STAPO_RUNTIME_ENV={missing} does not exist" in done.stderr
