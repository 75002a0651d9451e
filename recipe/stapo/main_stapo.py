"""verl's PPO entry point with STAPO: ``python -m recipe.stapo.main_stapo key=value ...``.

As verl's ``main_dapo``: compose the config (``conf/stapo_trainer.yaml``: verl's ``ppo_trainer`` +
an ``algo``, a ``model_preset`` and optionally a ``logger`` preset), prepare what the driver must
(CPU back-end, checks, local model, generated data, loggers), then run verl's own ``run_ppo``.

A refused setting (``STAPOConfigError``, Hydra's misspelt key or preset) is one line on stderr,
``stapo: <message>``, and exit code 2, before Ray starts and before Hydra writes or echoes anything
(``main`` composes the overrides once itself first); ``STAPO_DEBUG=1`` adds the traceback.
``--cfg job`` checks the settings before printing the config; ``stapo check`` also checks the paths.
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf, open_dict

from stapo.config_dir import CONFIG_NAME, config_dir

CONF_DIR = config_dir()


def prepare(config: DictConfig) -> DictConfig:
    """Everything that must happen on the driver before verl: back-end, checks, model, data, loggers."""
    from stapo.data.tasks import ensure_task_data
    from stapo.input_checks import check_inputs
    from stapo.models.local import resolve_model_path
    from stapo.preset_fit import check_preset_fit
    from stapo.rundir import write_config, write_machine
    from stapo.runs.machine import model_from_another_kind, run_machine
    from stapo.verl_plugin.cpu import enable_for_run
    from stapo.verl_plugin.preflight.checkpoint_identity import check_checkpoint_identity, hand_to_trainer, run_identity
    from stapo.verl_plugin.preflight.cluster_shape import check_cluster_shape
    from stapo.verl_plugin.preflight.run_checks import check_model_for_rollout, validate_run_config
    from stapo.verl_plugin.preflight.run_paths import settle_run_paths
    from stapo.verl_plugin.registration import assert_registered
    from stapo.verl_plugin.reproducible.seeding import pin_reproducibility
    from stapo.verl_plugin.training.loggers import prepare_loggers

    # the run's folders absolute, before anything reads them: the checkpoint folder from the model path as given
    # (before a local model's name becomes its cache folder), the same absolute path in every process
    settle_run_paths(config)
    # a CPU preset with another model, data or device: refused before the back-end's own device checks
    check_preset_fit(config)
    # the driver already imported verl: the CPU back-end is switched on here (when asked, or for
    # trainer.device=cpu without CUDA) and passed to the workers through Ray's runtime env
    enable_for_run(config)
    # the GPUs asked against the rollout layout and this machine, and verl's async trainers, before the pins below
    for note in check_cluster_shape(config, here=True, launch=True):
        print(f"[stapo] {note}", flush=True)
    # with stapo.seeded_rollouts=true (the CPU presets; an opt-in on a GPU): per-request rollout seeds (vLLM takes
    # them from sampling_params) and the batch in submission order, so two algorithms with the same seeds share
    # their first rollouts
    for setting in pin_reproducibility(config):
        print(f"[stapo] paired rollouts (docs/reproducibility.md): {setting}", flush=True)
    assert_registered()
    validate_run_config(config)
    # a user's rule and loss files (stapo.custom_rule, stapo.import_files): checked, then loaded by every process
    from stapo.verl_plugin.preflight.custom_rule_check import check_custom_files
    from stapo.verl_plugin.training.custom_rule import apply_to_run

    checked = check_custom_files(config)
    if checked is not None:
        print(f"[stapo] {checked.note()}", flush=True)
    for setting in apply_to_run(config, checked.kind if checked is not None else None):
        print(f"[stapo] your files, in every process: {setting}", flush=True)
    for note in check_inputs(config):
        print(f"[stapo] {note}", flush=True)
    # the reward file loaded and called on the first training rows, as verl's reward workers will
    from stapo.verl_plugin.preflight.reward_check import check_reward

    for note in check_reward(config):
        print(f"[stapo] {note}", flush=True)
    stapo = config.stapo
    with open_dict(config):
        config.actor_rollout_ref.model.path = resolve_model_path(config.actor_rollout_ref.model.path)
    check_model_for_rollout(config)
    machine = run_machine(config.actor_rollout_ref.model.path)
    if note := model_from_another_kind(machine, config.actor_rollout_ref.model.path):
        print(f"[stapo] note: {note}", flush=True)
    if stapo.get("synthetic_data_dir"):
        ensure_task_data(
            stapo.synthetic_data_dir,
            stapo.synthetic_train_rows,
            stapo.synthetic_val_rows,
            stapo.synthetic_seed,
            stapo.get("synthetic_task", "synthetic"),
        )
    run_dir = prepare_loggers(config)
    # resolve here: ${hydra:...} and ${oc.env:...} mean the driver's values, the remote has no Hydra
    OmegaConf.resolve(config)
    # what the run is, from the config verl receives: another run's checkpoints are not resumed; the trainer records
    # it in the checkpoint folder at each save (nothing is written there before the first)
    identity = run_identity(config)
    if note := check_checkpoint_identity(config, identity):
        print(f"[stapo] {note}", flush=True)
    if run_dir is not None:
        write_config(config, run_dir)
        write_machine(machine, run_dir)  # the sweep's record takes it from here, on whichever node the driver ran
    hand_to_trainer(config, identity)
    return config


# the two names of stapo/verl_plugin/cpu (hide_unused_vllm), without importing that package, which imports
# verl (tests/unit/test_cpu_activation.py checks that they agree)
HF_ROLLOUT, HIDE_VLLM_FLAG = "stapo_hf", "STAPO_HIDE_VLLM"


def hide_vllm_if_unused(config: DictConfig) -> None:
    """A run on the project's HF server never calls vLLM: the driver imports it as if absent, as its workers do
    (an environment that says ``STAPO_HIDE_VLLM=0`` keeps it). In ``main`` the config was composed without verl
    (``stapo.check.compose_run`` reads verl's config folder as files), so verl's first import, just below, runs the
    plugin with the flag set. Hydra's own composition (``hydra_main``, alone with ``--multirun`` and the like) uses
    the YAML's ``pkg://verl.trainer.config`` search path, which imports verl: there the plugin read the flag before
    it was set here, and it is applied again, before verl's trainer modules (which import vLLM) load."""
    if OmegaConf.select(config, "actor_rollout_ref.rollout.name", default=None) == HF_ROLLOUT:
        os.environ.setdefault(HIDE_VLLM_FLAG, "1")
        from stapo.verl_plugin.cpu import hide_unused_vllm

        hide_unused_vllm()


def run(config: DictConfig) -> None:
    hide_vllm_if_unused(config)  # main() did it already, unless Hydra alone composed (e.g. --multirun)
    from verl.trainer.main_ppo import TaskRunnerV1, run_ppo
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config
    from verl.utils.device import auto_set_device

    from stapo.verl_plugin.preflight.cluster_shape import RayResourceCheck

    config = prepare(config)
    auto_set_device(config)
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    print(OmegaConf.to_yaml(config.actor_rollout_ref.actor.policy_loss), flush=True)
    # run_ppo initialises or joins Ray, then creates the TaskRunner (which creates the placement groups): the Ray
    # cluster's GPUs are compared with the run's in between, refused with both numbers instead of a wait
    run_ppo(config, task_runner_class=RayResourceCheck(TaskRunnerV1, config))


def refuse(error: Exception) -> None:
    """The one line of a refused setting, exit code 2 (the same on every `stapo` command)."""
    from stapo.algorithm.validation import refusal_line

    if os.environ.get("STAPO_DEBUG") == "1":
        traceback.print_exception(error)
    print(refusal_line(error), file=sys.stderr, flush=True)
    sys.exit(2)


@hydra.main(config_path=CONF_DIR, config_name=CONFIG_NAME, version_base=None)
def hydra_main(config: DictConfig) -> None:
    from stapo.algorithm.validation import STAPOConfigError

    try:
        run(config)
    except STAPOConfigError as error:
        refuse(error)
    except SystemExit as error:
        exited_early(error)
    except Exception:  # a failure of the run: its traceback, without Hydra's echo of the overrides
        traceback.print_exc()
        sys.exit(1)


# libraries that put their own hook in place of sys.exit (wandb does, once a run of it started in the process): the
# frame that called sys.exit is the one before the hook's
EXIT_HOOKS = ("wandb/sdk/lib/exit_hooks.py",)


def exited_early(error: SystemExit) -> None:
    """A ``sys.exit`` inside the run (a user's file, a library) ends it unfinished: a code of 0 or None would read
    as a finished run, so it is one line naming where the exit was called, and exit code 1; another code is kept."""
    if error.code not in (None, 0):
        raise error
    frames = [frame for frame in traceback.extract_tb(error.__traceback__)
              if not Path(frame.filename).as_posix().endswith(EXIT_HOOKS)]
    where = f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "(unknown)"
    print(f"stapo: the run called sys.exit({error.code!r}) at {where} before it finished: not a finished run",
          file=sys.stderr, flush=True)
    sys.exit(1)


def main() -> None:
    """Compose once with Hydra's compose API (same config folder, same overrides) and check the settings, to
    refuse a misspelt key or a bad setting in one line, then hand over to ``hydra_main`` (the run, ``--cfg``,
    ``--help``). A bad setting is refused before verl's trainer modules are imported."""
    from hydra._internal.utils import get_args_parser

    from stapo.algorithm.validation import STAPOConfigError
    from stapo.check import compose_run, quiet_optional_engines

    quiet_optional_engines()

    args, _ = get_args_parser().parse_known_args(sys.argv[1:])
    hydra_only = (args.help or args.hydra_help or args.info or args.shell_completion or args.multirun
                  or args.experimental_rerun or args.cfg == "hydra" or args.config_path or args.config_name
                  or args.config_dir)
    if not hydra_only:
        try:
            config = compose_run(args.overrides)  # imports no verl
            from stapo.preset_fit import check_preset_fit

            # prepare() checks again once the CPU back-end is set; --cfg job|all prints only a config the run takes
            check_preset_fit(config)  # imports no verl either
            hide_vllm_if_unused(config)  # before the imports below, the first of verl
            from stapo.verl_plugin.preflight.cluster_shape import check_cluster_shape
            from stapo.verl_plugin.preflight.run_checks import validate_run_config

            validate_run_config(config)
            check_cluster_shape(config, here=False)  # this machine's GPUs: in prepare(), when the run starts
        except STAPOConfigError as error:
            refuse(error)
    hydra_main()


if __name__ == "__main__":
    main()
