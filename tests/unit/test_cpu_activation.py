"""When the CPU back-end switches itself on for a run (driver side), and when it refuses to."""

from __future__ import annotations

import os

import pytest
import torch
from omegaconf import OmegaConf, open_dict

import stapo.verl_plugin.cpu as cpu
from stapo.algorithm.validation import STAPOConfigError


@pytest.fixture
def activations(monkeypatch):
    """Record activations instead of replacing this test process's verl platform."""
    calls = []
    monkeypatch.setattr(cpu, "activate_if_requested", lambda: calls.append(True))
    monkeypatch.setenv(cpu.ENV_FLAG, "0")
    monkeypatch.delenv(cpu.PRESTART_FLAG, raising=False)  # restored after the test: enable_for_run sets it
    return calls


def _config(device: str, env_vars: dict | None = None):
    ray_init = {"num_cpus": 16} if env_vars is None else {"runtime_env": {"env_vars": env_vars}}
    config = OmegaConf.create({"trainer": {"device": device}, "ray_kwargs": {"ray_init": ray_init}})
    OmegaConf.set_struct(config, True)  # as Hydra hands it over
    return config


def test_cpu_device_without_cuda_turns_it_on_for_driver_and_workers(activations, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    config = _config("cpu")
    assert cpu.enable_for_run(config) is True
    assert activations == [True] and cpu.requested()
    assert config.ray_kwargs.ray_init.runtime_env.env_vars[cpu.ENV_FLAG] == "1"
    assert config.ray_kwargs.ray_init.num_cpus == 16  # nothing else touched
    assert os.environ[cpu.PRESTART_FLAG] == "0"  # the raylet this driver starts starts no idle workers


def test_a_prestart_setting_of_the_user_is_kept(activations, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv(cpu.PRESTART_FLAG, "1")
    assert cpu.enable_for_run(_config("cpu")) is True
    assert os.environ[cpu.PRESTART_FLAG] == "1"


def test_gpu_run_is_left_alone(activations, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    config = _config("cuda")
    assert cpu.enable_for_run(config) is False
    assert activations == [] and not cpu.requested()
    assert "runtime_env" not in config.ray_kwargs.ray_init
    assert cpu.PRESTART_FLAG not in os.environ  # a GPU cluster keeps Ray's defaults


def test_cpu_device_on_a_cuda_machine_needs_the_flag(activations, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(STAPOConfigError, match="STAPO_CPU_BACKEND=1 to force it"):
        cpu.enable_for_run(_config("cpu"))
    assert activations == []
    # asked through the preset's runtime env (as model_preset=tiny does): allowed
    assert cpu.enable_for_run(_config("cpu", {cpu.ENV_FLAG: "1"})) is True


def test_flag_with_a_cuda_device_setting_is_refused(activations, monkeypatch):
    monkeypatch.setenv(cpu.ENV_FLAG, "1")
    with pytest.raises(STAPOConfigError, match="needs trainer.device=cpu"):
        cpu.enable_for_run(_config("cuda"))


@pytest.mark.parametrize("rollout, hidden", [("stapo_hf", True), ("vllm", False)])
def test_a_run_on_the_hf_server_hides_vllm_from_its_workers(activations, monkeypatch, rollout, hidden):
    """Only a run whose rollout is the HF server asks its workers to import vLLM as if absent."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv(cpu.HIDE_VLLM_FLAG, raising=False)
    config = _config("cpu")
    with open_dict(config):
        config.actor_rollout_ref = {"rollout": {"name": rollout}}
    assert cpu.enable_for_run(config) is True
    env_vars = config.ray_kwargs.ray_init.runtime_env.env_vars
    assert (env_vars.get(cpu.HIDE_VLLM_FLAG) == "1") is hidden, env_vars
    assert env_vars[cpu.ENV_FLAG] == "1"


def test_the_drivers_zero_keeps_vllm_in_the_workers(activations, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv(cpu.HIDE_VLLM_FLAG, "0")
    config = _config("cpu")
    with open_dict(config):
        config.actor_rollout_ref = {"rollout": {"name": "stapo_hf"}}
    cpu.enable_for_run(config)
    assert config.ray_kwargs.ray_init.runtime_env.env_vars[cpu.HIDE_VLLM_FLAG] == "0"


def test_a_gpu_run_on_vllm_never_hides_it(activations, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    config = _config("cuda")
    with open_dict(config):
        config.actor_rollout_ref = {"rollout": {"name": "stapo_hf"}}
    assert cpu.enable_for_run(config) is False
    assert "runtime_env" not in config.ray_kwargs.ray_init


def test_the_driver_hides_vllm_under_the_same_names_as_its_workers():
    """main_stapo sets the flag for itself before its first verl import, without importing this package."""
    from recipe.stapo import main_stapo
    from stapo.verl_plugin.cpu.rollout import ROLLOUT_NAME

    assert (main_stapo.HF_ROLLOUT, main_stapo.HIDE_VLLM_FLAG) == (ROLLOUT_NAME, cpu.HIDE_VLLM_FLAG)
