"""CPU back-end for verl: a platform (device cpu, gloo), FSDP2 engines on cpu, an HF-generate rollout.

Active only when asked: ``STAPO_CPU_BACKEND=1`` in the environment of every process (the tiny and
smollm2 presets put it in Ray's runtime env and ``main_stapo`` sets it in the driver), or, for a
run of ``main_stapo``, ``trainer.device=cpu`` on a machine without a CUDA device (the driver then
sets the flag for itself and for the workers, see ``enable_for_run``). A GPU machine therefore
never runs on it by accident. The HF rollout is registered in every case
(``actor_rollout_ref.rollout.name=stapo_hf``); it is a plain verl rollout back-end.
"""

from __future__ import annotations

import os
import sys

from stapo.verl_plugin.import_hooks import after_import

ENV_FLAG = "STAPO_CPU_BACKEND"
ROLLOUT_NAME = "stapo_hf"  # actor_rollout_ref.rollout.name of the HF rollout
ADAPTER_PATH = "stapo.verl_plugin.cpu.rollout.HFServerAdapter"
# set by the driver, in Ray's runtime env, for a CPU run on the HF server (see hide_unused_vllm)
HIDE_VLLM_FLAG = "STAPO_HIDE_VLLM"
# Ray's system setting, as an environment variable: prestart idle workers for the first driver (see enable_for_run)
PRESTART_FLAG = "RAY_prestart_worker_first_driver"


def requested() -> bool:
    return os.environ.get(ENV_FLAG, "0") == "1"


def register_rollout() -> None:
    """The HF rollout (``actor_rollout_ref.rollout.name=stapo_hf``) in verl's two rollout registries, each when
    verl imports it. Neither callback imports the rollout: the adapter registry holds a dotted path verl imports
    when a worker builds the adapter, the replica registry a loader verl calls when the trainer builds replicas."""
    after_import("verl.workers.rollout.base", _register_adapter)
    after_import("verl.workers.rollout.replica", _register_replica)


def _register_adapter(base) -> None:
    # verl has no public registration call for adapters: its registry is this module-level dict
    base._ROLLOUT_REGISTRY[(ROLLOUT_NAME, "async")] = ADAPTER_PATH


def _load_hf_replica():
    from stapo.verl_plugin.cpu.rollout import HFReplica

    return HFReplica


def _register_replica(replica) -> None:
    replica.RolloutReplicaRegistry.register(ROLLOUT_NAME, _load_hf_replica)


def _runtime_env_flag(config) -> str | None:
    env_vars = (((config.get("ray_kwargs") or {}).get("ray_init") or {}).get("runtime_env") or {}).get("env_vars")
    value = (env_vars or {}).get(ENV_FLAG)
    return None if value is None else str(value)


def enable_for_run(config) -> bool:
    """Driver side, before Ray starts: decide whether this run uses the CPU back-end.

    Asked for when ``STAPO_CPU_BACKEND=1`` is in the driver's environment or in the config's Ray
    runtime env, or when ``trainer.device=cpu`` and this machine has no CUDA device. When asked,
    the flag is set in this process and written into ``ray_kwargs.ray_init.runtime_env.env_vars``
    (every Ray worker imports verl, and with it this package, under that environment), the
    back-end is activated in the driver, and the run is made reproducible (``pin_reproducibility``:
    seeded requests, batch in submission order; not with ``stapo.seeded_rollouts=false``).
    ``trainer.device=cpu`` on a CUDA machine without the flag is refused: the CPU back-end replaces verl's
    platform and is never chosen by accident there.
    """
    import torch
    from omegaconf import OmegaConf

    from stapo.algorithm.validation import STAPOConfigError

    device = config.trainer.get("device", "cuda")
    asked = requested() or _runtime_env_flag(config) == "1"
    if not asked and device == "cpu":
        if torch.cuda.is_available():
            raise STAPOConfigError(
                "trainer.device=cpu on a machine with a CUDA device: the STAPO CPU back-end (gloo, HF-generate "
                f"rollout) only runs there when asked; set {ENV_FLAG}=1 to force it, or use trainer.device=cuda"
            )
        asked = True
    if not asked:
        return False
    if device != "cpu":
        raise STAPOConfigError(f"{ENV_FLAG}=1 runs verl on the CPU: it needs trainer.device=cpu (got {device!r})")
    os.environ[ENV_FLAG] = "1"
    OmegaConf.update(config, f"ray_kwargs.ray_init.runtime_env.env_vars.{ENV_FLAG}", "1", force_add=True)
    # read by the raylet this driver starts (a cluster already running keeps its own setting): Ray starts idle
    # Python workers when the first driver connects, which none of verl's actors takes (their runtime env is
    # another one): seconds of CPU each on a CPU run's cores at start-up (docs/benchmarks-history.md, "idle workers")
    os.environ.setdefault(PRESTART_FLAG, "0")
    if config.get("actor_rollout_ref", {}).get("rollout", {}).get("name") == ROLLOUT_NAME:
        # the driver's own value (main_stapo sets "1" unless the environment says otherwise: 0 turns it off)
        hide = os.environ.get(HIDE_VLLM_FLAG, "1")
        OmegaConf.update(config, f"ray_kwargs.ray_init.runtime_env.env_vars.{HIDE_VLLM_FLAG}", hide, force_add=True)
    activate_if_requested()
    from stapo.verl_plugin.reproducible.seeding import SWITCH_KEY, pin_reproducibility, seeded_rollouts

    # a CPU run is bit-for-bit reproducible (docs/reproducibility.md): seeded requests, batch in submission order
    for setting in pin_reproducibility(config):
        print(f"[stapo] CPU back-end, reproducible rollouts: {setting}", flush=True)
    if not seeded_rollouts(config):
        print(f"[stapo] CPU back-end: {SWITCH_KEY}=false, verl's own agent loop and replay order; the rollouts "
              "depend on timing and the run is not reproducible", flush=True)
    return True


def hide_unused_vllm() -> None:
    """In a process of a CPU run on the HF server (``STAPO_HIDE_VLLM=1``), import vLLM as if it were not installed.

    verl imports vLLM in every process that loads its checkpoint engines (the optional Ascend engine imports
    ``vllm.distributed`` whenever vLLM is installed, as it is in the CPU set-up for the vLLM runs), and vLLM's
    import loads torch's inductor, for a rollout that never calls it (docs/benchmarks-history.md, 2026-11-27: start-up).
    ``None`` in ``sys.modules`` is Python's own way to make ``import vllm`` fail at once: verl records that
    optional engine as unavailable, exactly as on an install without vLLM. ``STAPO_HIDE_VLLM=0`` in the
    driver's environment keeps the import; a run on vLLM never sets the flag, and a process that already
    imported vLLM keeps it."""
    if os.environ.get(HIDE_VLLM_FLAG) == "1":
        sys.modules.setdefault("vllm", None)


def activate_if_requested() -> None:
    """Register the HF rollout; with STAPO_CPU_BACKEND=1 also make this process run verl on the CPU: the
    platform now (verl's modules pick their device from it as they load), the patches of verl's FSDP worker
    and engine when those are imported (only the FSDP worker process imports them)."""
    if requested():
        from verl.plugin.platform import set_platform

        from stapo.verl_plugin.cpu import patches
        from stapo.verl_plugin.cpu.platform import PLATFORM_NAME, PlatformStapoCPU

        os.environ["VERL_PLATFORM"] = PLATFORM_NAME  # children resolve the same platform
        set_platform(PlatformStapoCPU())
        after_import("verl.workers.engine_workers", patches.patch_engine_workers)
        after_import("verl.workers.engine.fsdp.transformer_impl", patches.patch_fsdp_engine)
    register_rollout()
