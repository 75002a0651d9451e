"""STAPO is registered in verl in every process, and bad settings fail before any worker starts."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from hydra.errors import InstantiationException
from verl.utils.config import omega_conf_to_dataclass

from stapo.algorithm.validation import STAPOConfigError
from stapo.verl_plugin.preflight.run_checks import validate_run_config
from stapo.verl_plugin.training.config import STAPOPolicyLossConfig
from tests.integration.verl_batches import PL, compose_verl, stapo_overrides

CHECK = (
    "import verl\n"
    "from verl.trainer.ppo.core_algos import get_policy_loss_fn\n"
    "from verl.trainer.ppo.v1.trainer_base import get_trainer_cls\n"
    "get_policy_loss_fn('masked_clip')\n"
    "print('REGISTERED', get_trainer_cls('stapo').__name__)\n"
)


@pytest.mark.slow  # starts processes: out of make test-fast
@pytest.mark.parametrize("hide", ["1", None])
def test_a_worker_of_a_run_on_the_hf_server_registers_without_importing_vllm(hide):
    """STAPO_HIDE_VLLM=1 (the driver's flag for a CPU run on the HF server): the plugin, the trainer and
    verl's checkpoint engines load, vLLM does not; without the flag vLLM loads as before where installed.

    Both cases are also a fresh process that only does ``import verl``: the ``verl.plugins`` entry point of the
    installed package does the rest (registered masked_clip and trainer 'stapo'). That was a process of its own
    before; the case without the flag is the same process."""
    import importlib.util
    import os

    from stapo.verl_plugin.cpu import HIDE_VLLM_FLAG

    installed = importlib.util.find_spec("vllm") is not None
    code = CHECK + (
        "import sys, verl.checkpoint_engine\n"
        "print('VLLM', 'absent' if sys.modules.get('vllm', 'absent') in (None, 'absent') else 'imported')\n"
    )
    env = {key: value for key, value in os.environ.items() if key != HIDE_VLLM_FLAG}
    if hide:
        env[HIDE_VLLM_FLAG] = hide
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd="/", env=env, check=False
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "REGISTERED STAPOTrainer" in out.stdout
    assert ("VLLM imported" in out.stdout) is (installed and not hide), out.stdout


@pytest.mark.slow  # starts processes: out of make test-fast
@pytest.mark.parametrize(
    "first", ["training.driver_diagnostics", "training.losses", "training.shard_mask", "training.actor_worker"]
)
def test_registered_whichever_glue_module_is_imported_first(first):
    """A glue module imported before verl used to trigger the entry point while half-imported itself:
    the trainer's import of it failed inside verl's plugin loader and trainer 'stapo' went missing."""
    code = f"import stapo.verl_plugin.{first}\n" + CHECK
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd="/", check=False
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "REGISTERED STAPOTrainer" in out.stdout


LAZY = (
    "import sys, verl\n"
    "ours = ['stapo.verl_plugin.training.trainer', 'stapo.verl_plugin.training.losses',\n"
    "        'stapo.verl_plugin.reproducible.seeded_agent_loop',\n"
    "        'stapo.verl_plugin.cpu.rollout', 'verl.workers.engine_workers', 'verl.trainer.ppo.v1']\n"
    "print('AFTER_IMPORT_VERL', [m for m in ours if m in sys.modules])\n"
    "from verl.workers.rollout.base import get_rollout_class\n"
    "from verl.workers.rollout.replica import RolloutReplicaRegistry\n"
    "print('ROLLOUT', get_rollout_class('stapo_hf').__name__, RolloutReplicaRegistry.get('stapo_hf').__name__)\n"
    "from verl.workers import engine_workers\n"
    "from verl.workers.engine.base import EngineRegistry\n"
    "from stapo.verl_plugin.cpu.patches import init_gloo_process_group\n"
    "print('PATCHED', engine_workers.initialize_global_process_group_ray is init_gloo_process_group,\n"
    "      'cpu' in EngineRegistry._engines['language_model']['fsdp2'])\n"
) + CHECK


@pytest.mark.slow  # starts processes: out of make test-fast
def test_each_registration_waits_for_its_registry_and_then_is_there():
    """A CPU run's process: `import verl` loads none of the pieces (a Ray worker that never builds a trainer
    never imports it); importing the registry's module registers each, the CPU patches included."""
    import os

    from stapo.verl_plugin.cpu import ENV_FLAG, HIDE_VLLM_FLAG

    env = {**os.environ, ENV_FLAG: "1", HIDE_VLLM_FLAG: "1"}
    out = subprocess.run(
        [sys.executable, "-c", LAZY], capture_output=True, text=True, timeout=300, cwd="/", env=env, check=False
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "AFTER_IMPORT_VERL []" in out.stdout, out.stdout
    assert "ROLLOUT HFServerAdapter HFReplica" in out.stdout
    assert "PATCHED True True" in out.stdout
    assert "REGISTERED STAPOTrainer" in out.stdout


def test_the_agent_loop_entry_is_the_one_verl_s_decorator_writes():
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry

    from stapo.verl_plugin.reproducible.seeded_agent_loop import SeededSingleTurnAgentLoop
    from stapo.verl_plugin.reproducible.seeding import AGENT_LOOP_NAME

    cls = SeededSingleTurnAgentLoop
    assert _agent_loop_registry[AGENT_LOOP_NAME] == {"_target_": f"{cls.__module__}.{cls.__qualname__}"}


@pytest.mark.slow  # starts processes: out of make test-fast
def test_plugin_switched_off_is_reported_clearly():
    code = (
        "import verl\n"
        "from stapo.verl_plugin.registration import assert_registered\n"
        "assert_registered()\n"
    )
    env = {"VERL_USE_EXTERNAL_PLUGINS": "none", "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd="/", env=env, check=False
    )
    assert out.returncode != 0
    assert "STAPO is not registered in verl" in out.stderr


@pytest.mark.slow  # starts processes: out of make test-fast
def test_registered_inside_a_ray_worker():
    import tempfile

    import ray

    temp_dir = tempfile.mkdtemp(prefix="ray-", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    ray.init(
        num_cpus=1,
        include_dashboard=False,
        _temp_dir=temp_dir,
        runtime_env={"env_vars": {"VERL_USE_EXTERNAL_PLUGINS": "auto"}},
        log_to_driver=False,
    )
    try:

        @ray.remote
        def probe() -> list[str]:
            import verl  # noqa: F401  (the worker's own import triggers the entry point)
            from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY
            from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY

            return sorted(POLICY_LOSS_REGISTRY) + ["trainer:" + name for name in sorted(TRAINER_REGISTRY)]

        names = ray.get(probe.remote(), timeout=240)
    finally:
        ray.shutdown()
    assert {"masked_clip", "vanilla", "trainer:stapo"} <= set(names)
    assert not {"stapo", "entropy20"} & set(names)  # masks are token_mask entries now, not losses


def test_hydra_target_types_the_new_fields():
    cfg = compose_verl(stapo_overrides(token_mask="stapo", tau_p=0.003, entropy_quantile=0.8, source="current"))
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    assert isinstance(actor.policy_loss, STAPOPolicyLossConfig)
    pl = actor.policy_loss
    assert (pl.loss_mode, pl.token_mask) == ("masked_clip", "stapo")
    assert (pl.tau_p, pl.entropy_quantile, pl.source) == (0.003, 0.8, "current")


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("tau_p", 1.5, "actor_rollout_ref.actor.policy_loss.tau_p must be a probability in (0, 1)"),
        ("tau_p", 0, "actor_rollout_ref.actor.policy_loss.tau_p must be a probability in (0, 1)"),
        ("entropy_quantile", 0, "actor_rollout_ref.actor.policy_loss.entropy_quantile must be in (0, 1]"),
        ("entropy_quantile", 1.01, "actor_rollout_ref.actor.policy_loss.entropy_quantile must be in (0, 1]"),
        ("source", "fresh", "actor_rollout_ref.actor.policy_loss.source must be one of ['old', 'current']"),
        ("entropy_top_fraction", 0, "entropy_top_fraction must be in (0, 1]"),
        ("entropy_denominator", "some", "entropy_denominator must be one of ['all', 'kept']"),
    ],
)
def test_out_of_range_values_are_rejected_with_the_key_and_range(field, value, message):
    cfg = compose_verl(stapo_overrides(token_mask="stapo", **{field: value}))
    with pytest.raises(STAPOConfigError, match=re.escape(message)):
        validate_run_config(cfg)
    with pytest.raises(InstantiationException, match=field):
        omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)


def test_source_current_without_entropy_says_how_to_turn_it_on():
    cfg = compose_verl(stapo_overrides(token_mask="stapo", source="current"))
    with pytest.raises(STAPOConfigError, match="calculate_entropy=true"):
        validate_run_config(cfg)
    entropy_on = ["actor_rollout_ref.actor.calculate_entropy=true"]
    cfg = compose_verl(stapo_overrides(token_mask="stapo", source="current") + entropy_on)
    validate_run_config(cfg)


@pytest.mark.parametrize("agg", ["token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_current_source_refuses_other_aggregations_old_accepts_them(agg):
    current = stapo_overrides(token_mask="stapo", source="current") + [
        "actor_rollout_ref.actor.calculate_entropy=true",
        f"actor_rollout_ref.actor.loss_agg_mode={agg}",
    ]
    with pytest.raises(STAPOConfigError, match="token-mean only"):
        validate_run_config(compose_verl(current))
    old = stapo_overrides(token_mask="stapo", source="old") + [f"actor_rollout_ref.actor.loss_agg_mode={agg}"]
    validate_run_config(compose_verl(old))


def test_bypass_mode_contradicts_source_old():
    cfg = compose_verl(stapo_overrides(token_mask="stapo") + ["algorithm.rollout_correction.bypass_mode=true"])
    with pytest.raises(STAPOConfigError, match="bypass_mode"):
        validate_run_config(cfg)


def test_vanilla_runs_are_not_checked_for_stapo_fields():
    validate_run_config(compose_verl(["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2"]))


def test_masked_clip_without_the_typed_config_is_refused():
    cfg = compose_verl(
        ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", f"{PL}.loss_mode=masked_clip"]
    )
    with pytest.raises(STAPOConfigError, match="_target_=stapo.verl_plugin.training.config.STAPOPolicyLossConfig"):
        validate_run_config(cfg)


@pytest.mark.parametrize("old_mode", ["stapo", "entropy20"])
def test_loss_modes_of_earlier_versions_are_refused_with_the_new_spelling(old_mode):
    cfg = compose_verl(stapo_overrides(loss_mode=old_mode))
    with pytest.raises(STAPOConfigError) as error:
        validate_run_config(cfg)
    assert f"became loss_mode=masked_clip with token_mask={old_mode}" in str(error.value)


@pytest.mark.parametrize("mask", ["stapo", "entropy20"])
def test_a_token_mask_without_the_stapo_trainer_is_refused(mask):
    """verl's own trainers never fold the mask: it would silently not be applied."""
    cfg = compose_verl(stapo_overrides(trainer_mode="sync", token_mask=mask))
    with pytest.raises(STAPOConfigError, match=f"token_mask={mask} needs trainer.v1.trainer_mode=stapo"):
        validate_run_config(cfg)
    validate_run_config(compose_verl(stapo_overrides(trainer_mode="sync", token_mask="none")))  # no mask: any trainer
