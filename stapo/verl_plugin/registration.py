"""Registering STAPO's pieces in verl's registries, and checking that it happened.

Each piece is registered in a process when verl's module holding its registry is imported there
(``stapo.verl_plugin.import_hooks``), not when the plugin loads: a Ray worker that never builds a trainer
never imports the trainer. Where each hook sits, and why its callback cannot meet a half-imported module:

- policy losses ``masked_clip``, ``gmpo`` and ``dcpo``: on ``verl.trainer.ppo.core_algos`` (``POLICY_LOSS_REGISTRY``);
  ``stapo.verl_plugin.training.losses`` imports only modules core_algos already needs (verl's ``ppo_loss``, whose module
  imports core_algos, is imported at its call).
- agent loop ``stapo_seeded``: on ``verl.experimental.agent_loop.agent_loop``; the callback writes the registry
  entry verl's ``register`` decorator writes, a dotted path Hydra imports when a worker builds the loop.
- trainer ``stapo``: on the package ``verl.trainer.ppo.v1``, which has imported ``trainer_base`` and every
  trainer module the STAPO trainer builds on by the time it finishes.
- the HF rollout and the CPU back-end's patches: ``stapo.verl_plugin.cpu`` (``activate_if_requested``).
"""

from __future__ import annotations

import importlib

from stapo.verl_plugin.import_hooks import after_import, waiting_for

REQUIRED_LOSSES = ("masked_clip", "gmpo", "dcpo")
SEEDED_LOOP_PATH = "stapo.verl_plugin.reproducible.seeded_agent_loop.SeededSingleTurnAgentLoop"
# the verl modules whose import registers a piece (assert_registered imports them to check all of them)
LOSS_REGISTRY_MODULE = "verl.trainer.ppo.core_algos"
AGENT_LOOP_REGISTRY_MODULE = "verl.experimental.agent_loop.agent_loop"
TRAINER_PACKAGE = "verl.trainer.ppo.v1"


def register_losses(_core_algos) -> None:
    # its decorators register "masked_clip", "gmpo", "dcpo"
    importlib.import_module("stapo.verl_plugin.training.losses")


def register_agent_loop(agent_loop_module) -> None:
    from stapo.verl_plugin.reproducible.seeding import AGENT_LOOP_NAME

    # what verl's ``register(name)`` stores for a class (tests compare the two); the class is imported when a
    # worker instantiates the loop, not here
    agent_loop_module._agent_loop_registry.setdefault(AGENT_LOOP_NAME, {"_target_": SEEDED_LOOP_PATH})


def register_trainer(_v1_package) -> None:
    importlib.import_module("stapo.verl_plugin.training.trainer")  # its decorator registers trainer "stapo"


def register_all() -> None:
    """Everything the project registers in verl, for every device, in one place: the CPU back-end first
    (it decides the platform before verl modules pick a device, and hooks the HF rollout and the CPU patches),
    then the policy losses, the seeded agent loop and the trainer (which GPU runs use too), each when verl
    imports its registry. Idempotent: a second call adds hooks whose registrations are already made."""
    from stapo.verl_plugin.cpu import activate_if_requested, hide_unused_vllm

    hide_unused_vllm()  # first: the modules below load verl's checkpoint engines
    activate_if_requested()
    after_import(LOSS_REGISTRY_MODULE, register_losses)
    after_import(AGENT_LOOP_REGISTRY_MODULE, register_agent_loop)
    after_import(TRAINER_PACKAGE, register_trainer)
    from stapo.verl_plugin.training.custom_rule import load_on_import

    load_on_import()  # a user's rule and loss files (stapo.custom_rule, stapo.import_files), when the run names any


def assert_registered() -> None:
    """Fail loudly when the plugin did not load in this process (e.g. a stale egg-info shadows it). Imports
    the registries' modules, which makes the hooks register what they wait for."""
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
    from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY
    from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY

    from stapo.verl_plugin.reproducible.seeding import AGENT_LOOP_NAME

    missing = [name for name in REQUIRED_LOSSES if name not in POLICY_LOSS_REGISTRY]
    if "stapo" not in TRAINER_REGISTRY:
        missing.append("trainer 'stapo'")
    if AGENT_LOOP_NAME not in _agent_loop_registry:
        missing.append(f"agent loop {AGENT_LOOP_NAME!r}")
    if missing:
        pending = waiting_for()
        raise RuntimeError(
            f"STAPO is not registered in verl in this process (missing: {missing}"
            + (f"; registrations still waiting for the import of {pending}" if pending else "")
            + "). The package installs a "
            "'verl.plugins' entry point that `import verl` loads; check that `pip show stapo` lists it, that "
            "VERL_USE_EXTERNAL_PLUGINS is not 'none', and that no stale stapo*.egg-info or 'stapo' folder "
            "in the working directory shadows the installed package. Run `python -c \"import "
            "stapo.verl_plugin.entry\"` to see the import error verl hides."
        )
