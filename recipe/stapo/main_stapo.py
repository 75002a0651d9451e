"""verl's PPO entry point with STAPO: ``python -m recipe.stapo.main_stapo key=value ...``.

Composes ``conf/stapo_trainer.yaml`` (verl's ``ppo_trainer`` + an ``algo`` and a ``model_preset``),
resolves this recipe's own keys (``stapo.*`` and ``stapo://`` model paths), checks every STAPO
setting before Ray starts, and then runs verl's own ``run_ppo`` with verl's v1 task runner.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf, open_dict

CONF_DIR = str(Path(__file__).resolve().parents[2] / "conf")


def resolve_model_path(path: str) -> str:
    """``stapo://tiny`` and ``stapo://smollm2`` are built or converted locally; anything else is verl's."""
    if path == "stapo://tiny":
        from stapo.models.tiny import build_tiny_model

        return build_tiny_model()
    if path == "stapo://smollm2":
        from stapo.models.smollm2 import smollm2_path

        return smollm2_path()
    if path.startswith("stapo://"):
        raise ValueError(f"actor_rollout_ref.model.path={path!r}: known local models are stapo://tiny, stapo://smollm2")
    return path


SYNTHETIC_TASKS = {
    # task name: (module with write_parquet(out_dir, train, val, seed), its file names)
    "synthetic": ("stapo.data.synthetic", ("train.parquet", "val.parquet")),
    "arithmetic": ("stapo.data.arithmetic", ("train.parquet", "heldout.parquet")),
}


def ensure_synthetic_data(data_dir: str, train_rows: int, val_rows: int, seed: int, task: str = "synthetic") -> None:
    """Write a generated task's parquet files unless the folder already holds these exact settings."""
    import importlib

    if task not in SYNTHETIC_TASKS:
        raise ValueError(f"stapo.synthetic_task={task!r}: known tasks are {', '.join(SYNTHETIC_TASKS)}")
    module, names = SYNTHETIC_TASKS[task]
    folder = Path(data_dir)
    marker = folder / "stapo_synthetic.json"
    wanted = {"task": task, "train_rows": int(train_rows), "val_rows": int(val_rows), "seed": int(seed)}
    present = all((folder / name).exists() for name in names)
    if present and marker.exists() and json.loads(marker.read_text()) == wanted:
        return
    importlib.import_module(module).write_parquet(folder, wanted["train_rows"], wanted["val_rows"], wanted["seed"])
    marker.write_text(json.dumps(wanted))


def prepare(config: DictConfig) -> DictConfig:
    """Everything that must happen on the driver before verl: local model, data, checks."""
    from stapo.rundir import prepare_run_dir, write_config
    from stapo.verl_plugin.cpu import enable_for_run
    from stapo.verl_plugin.registration import assert_registered
    from stapo.verl_plugin.run_checks import validate_run_config

    # the driver already imported verl: the CPU back-end is switched on here (when asked, or for
    # trainer.device=cpu without CUDA) and passed to the workers through Ray's runtime env
    enable_for_run(config)
    assert_registered()
    validate_run_config(config)
    with open_dict(config):
        config.actor_rollout_ref.model.path = resolve_model_path(config.actor_rollout_ref.model.path)
        data_dir = config.stapo.get("synthetic_data_dir")
        if data_dir:
            ensure_synthetic_data(
                data_dir,
                config.stapo.synthetic_train_rows,
                config.stapo.synthetic_val_rows,
                config.stapo.synthetic_seed,
                config.stapo.get("synthetic_task", "synthetic"),
            )
    run_dir = prepare_run_dir(config)
    keep_wandb_offline_unless_asked(config)
    # resolve here: ${hydra:...} and ${oc.env:...} mean the driver's values, the remote has no Hydra
    OmegaConf.resolve(config)
    if run_dir is not None:
        write_config(config, run_dir)
    return config


def keep_wandb_offline_unless_asked(config: DictConfig) -> None:
    """wandb uploads as soon as it finds an API key; the workers get WANDB_MODE=offline unless the user set it.

    Only the Ray runtime env changes (verl's tracking runs in the TaskRunner worker), never this
    process's environment.
    """
    from stapo.secrets import wandb_env_defaults

    env_vars = OmegaConf.select(config, "ray_kwargs.ray_init.runtime_env.env_vars") or {}
    for key, value in wandb_env_defaults(config.trainer.logger, env_vars).items():
        OmegaConf.update(config, f"ray_kwargs.ray_init.runtime_env.env_vars.{key}", value, force_add=True)


@hydra.main(config_path=CONF_DIR, config_name="stapo_trainer", version_base=None)
def main(config: DictConfig) -> None:
    from verl.trainer.main_ppo import TaskRunnerV1, run_ppo
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config
    from verl.utils.device import auto_set_device

    config = prepare(config)
    auto_set_device(config)
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    print(OmegaConf.to_yaml(config.actor_rollout_ref.actor.policy_loss), flush=True)
    run_ppo(config, task_runner_class=TaskRunnerV1)


if __name__ == "__main__":
    main()
