"""Registering STAPO's pieces in verl's registries, and checking that it happened."""

from __future__ import annotations

REQUIRED_LOSSES = ("masked_clip", "gmpo")


def register_all() -> None:
    """Everything the project registers in verl, for every device, in one place: the CPU back-end first
    (it decides the platform before verl modules pick a device, and registers the HF rollout), then the
    policy losses, the trainer and the seeded agent loop (which GPU runs use too). Idempotent:
    importing a module twice registers nothing twice."""
    from stapo.verl_plugin.cpu import activate_if_requested, hide_unused_vllm

    hide_unused_vllm()  # first: the imports below load verl's checkpoint engines
    activate_if_requested()
    import stapo.verl_plugin.losses  # noqa: F401  (registers "masked_clip", "gmpo")
    import stapo.verl_plugin.seeded_agent_loop  # noqa: F401  (registers agent loop "stapo_seeded")
    import stapo.verl_plugin.trainer  # noqa: F401  (registers trainer "stapo")


def assert_registered() -> None:
    """Fail loudly when the plugin did not load in this process (e.g. a stale egg-info shadows it)."""
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
    from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY
    from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY

    from stapo.verl_plugin.seeding import AGENT_LOOP_NAME

    missing = [name for name in REQUIRED_LOSSES if name not in POLICY_LOSS_REGISTRY]
    if "stapo" not in TRAINER_REGISTRY:
        missing.append("trainer 'stapo'")
    if AGENT_LOOP_NAME not in _agent_loop_registry:
        missing.append(f"agent loop {AGENT_LOOP_NAME!r}")
    if missing:
        raise RuntimeError(
            f"STAPO is not registered in verl in this process (missing: {missing}). The package installs a "
            "'verl.plugins' entry point that `import verl` loads; check that `pip show stapo` lists it, that "
            "VERL_USE_EXTERNAL_PLUGINS is not 'none', and that no stale stapo*.egg-info or 'stapo' folder "
            "in the working directory shadows the installed package. Run `python -c \"import "
            "stapo.verl_plugin.entry\"` to see the import error verl hides."
        )
