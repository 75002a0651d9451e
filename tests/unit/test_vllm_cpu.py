"""The vLLM-CPU rollout's driver-side checks and the shims vLLM loads (stapo/verl_plugin/cpu/)."""

from __future__ import annotations

import inspect
import json
from importlib import metadata

import pytest
from omegaconf import OmegaConf

from stapo.verl_plugin.cpu import vllm_cpu


def run_config(**rollout):
    return OmegaConf.create(
        {"trainer": {"device": "cpu"}, "actor_rollout_ref": {"rollout": {"name": "vllm", **rollout}}}
    )


def test_make_setup_installs_the_cpu_build_the_shims_are_written_for():
    assert vllm_cpu.installed_vllm() == f"{vllm_cpu.VLLM_CPU_VERSION}+cpu"
    assert metadata.version("vllm-cpu") == vllm_cpu.VLLM_CPU_VERSION


def test_sleep_mode_is_refused_on_the_cpu_and_other_rollouts_are_not_checked():
    assert "enable_sleep_mode must be false" in vllm_cpu.config_problem(run_config())  # verl's default: on
    assert vllm_cpu.config_problem(run_config(enable_sleep_mode=False)) is None
    assert vllm_cpu.config_problem(run_config(name="stapo_hf")) is None
    gpu = run_config()
    gpu.trainer.device = "cuda"
    assert vllm_cpu.config_problem(gpu) is None


def test_a_missing_or_gpu_vllm_is_refused_naming_the_cpu_build(monkeypatch):
    # the environment has the CPU build; what another environment would report is stood in for
    for found, expected in ((None, "found no vllm distribution"), ("0.24.0", "found vllm 0.24.0 (not a CPU build)")):
        monkeypatch.setattr(vllm_cpu, "installed_vllm", lambda found=found: found)
        message = vllm_cpu.config_problem(run_config(enable_sleep_mode=False))
        assert message.startswith("actor_rollout_ref.rollout.name=vllm with trainer.device=cpu needs vLLM's CPU build")
        assert expected in message and "make setup" in message


@pytest.mark.parametrize(
    ("model", "refused"),
    [
        ({"head_dim": 16, "num_attention_heads": 4, "hidden_size": 64}, True),
        ({"head_dim": 32, "num_attention_heads": 2, "hidden_size": 64}, False),
        ({"num_attention_heads": 9, "hidden_size": 576}, False),  # SmolLM2-135M: 576 / 9 = 64
        ({"num_attention_heads": 4, "hidden_size": 96}, True),  # 24
        ({"text_config": {"head_dim": 8, "num_attention_heads": 2}}, True),
    ],
)
def test_head_sizes_without_a_cpu_attention_kernel_are_refused(tmp_path, model, refused):
    (tmp_path / "config.json").write_text(json.dumps(model))
    problem = vllm_cpu.model_problem(str(tmp_path))
    assert (problem is not None) == refused
    if refused:
        assert "vLLM's CPU attention supports 32, 64, 80" in problem and "stapo_hf" in problem
    assert vllm_cpu.model_problem("Qwen/Qwen3-8B") is None  # a hub id: vLLM reads it itself


def test_the_local_models_run_on_vllm():
    from stapo.models.testbed import build_testbed_model  # noqa: F401  (built by its own tests)
    from stapo.models.tiny import build_tiny_model

    assert vllm_cpu.model_problem(build_tiny_model()) is None


@pytest.mark.slow  # imports vLLM: ~10 s on 2 cores
def test_the_head_size_list_is_vllms_and_the_shims_apply():
    from vllm.model_executor.layers import utils
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
    from vllm.v1.engine.output_processor import OutputProcessor

    from stapo.verl_plugin.cpu import vllm_shims

    assert tuple(CPUAttentionBackend.get_supported_head_sizes()) == vllm_cpu.CPU_ATTENTION_HEAD_SIZES
    vllm_shims.apply()
    vllm_shims.apply()  # vLLM may load a plugin more than once per process
    assert getattr(utils.dispatch_cpu_unquantized_gemm, "_stapo_keeps_weights", False)
    assert inspect.signature(OutputProcessor.abort_requests).parameters["internal"].default is False
    names = {entry.name: entry.value for entry in metadata.entry_points(group="vllm.general_plugins")}
    assert names.get("stapo_cpu") == "stapo.verl_plugin.cpu.vllm_shims:apply"


@pytest.mark.slow  # imports vLLM: ~10 s on 2 cores
def test_the_doctors_vllm_probe_reads_the_installed_build(monkeypatch):
    from stapo.doctor.checks import OK, WARN, check_vllm
    from stapo.doctor.probes import probe_vllm

    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    facts = probe_vllm()
    # vllm-cpu 0.31.0 still takes verl's pause argument (deprecated); abort_requests needs `internal`
    assert facts["version"] == "0.31.0+cpu" and facts["pause_takes_wait_flag"] is True, facts
    assert "import_error" not in facts and facts["shim_allowed"] is True
    assert check_vllm({"n": facts}, {}).status == OK
    monkeypatch.setenv("VLLM_PLUGINS", "lora_filesystem_resolver")
    assert check_vllm({"n": probe_vllm()}, {}).status == (WARN if facts["abort_needs_internal"] else OK)
