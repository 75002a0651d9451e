"""CPU back-end for verl: a platform (device cpu, gloo), FSDP2 engines on cpu, an HF-generate rollout.

Active only when asked: ``STAPO_CPU_BACKEND=1`` in the environment of every process (the tiny and
smollm2 presets put it in Ray's runtime env and ``main_stapo`` sets it in the driver). A GPU
machine therefore never runs on it by accident. The HF rollout is registered in every case
(``actor_rollout_ref.rollout.name=stapo_hf``); it is a plain verl rollout back-end.
"""

from __future__ import annotations

import os

ENV_FLAG = "STAPO_CPU_BACKEND"


def requested() -> bool:
    return os.environ.get(ENV_FLAG, "0") == "1"


def register_rollout() -> None:
    from verl.workers.rollout import base as rollout_base
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    from stapo.verl_plugin.cpu.rollout import ROLLOUT_NAME, HFReplica

    # verl has no public registration call for adapters: its registry is this module-level dict
    rollout_base._ROLLOUT_REGISTRY[(ROLLOUT_NAME, "async")] = "stapo.verl_plugin.cpu.rollout.HFServerAdapter"
    RolloutReplicaRegistry.register(ROLLOUT_NAME, lambda: HFReplica)


def activate_if_requested() -> None:
    """Register the HF rollout; with STAPO_CPU_BACKEND=1 also make this process run verl on the CPU."""
    if requested():
        from verl.plugin.platform import set_platform

        from stapo.verl_plugin.cpu import patches
        from stapo.verl_plugin.cpu.platform import PLATFORM_NAME, PlatformStapoCPU

        os.environ["VERL_PLATFORM"] = PLATFORM_NAME  # children resolve the same platform
        set_platform(PlatformStapoCPU())
        patches.apply()
    register_rollout()
