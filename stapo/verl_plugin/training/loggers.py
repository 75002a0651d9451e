"""verl's loggers for a STAPO run: where they write, wandb offline unless asked, where to look.

verl's ``Tracking`` takes its back-ends from ``trainer.logger`` and their locations from the
environment of the process that logs, the TaskRunner (a Ray worker): ``VERL_FILE_LOGGER_PATH`` for
``file``, ``TENSORBOARD_DIR`` for ``tensorboard``, ``WANDB_DIR`` and ``WANDB_MODE`` for wandb. The
driver therefore sets them in the Ray runtime env, never in its own environment (a later run or
test in the same process would inherit them). The file names of a run folder are the pure core's
(``stapo.rundir``); this module is what ties them to verl.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from stapo.rundir import METRICS_NAME, TENSORBOARD_NAME, WANDB_NAME, rotate_metrics

ENV_VARS = "ray_kwargs.ray_init.runtime_env.env_vars"


def logger_list(loggers: Any) -> list[str]:
    """``trainer.logger`` as a list (verl accepts one name or a list)."""
    return [loggers] if isinstance(loggers, str) else [str(name) for name in (loggers or [])]


def wandb_env_defaults(loggers: Any, runtime_env_vars: Mapping[str, Any] | None, environ=None) -> dict[str, str]:
    """``{"WANDB_MODE": "offline"}`` when wandb is a logger and nobody chose its mode, else ``{}``.

    wandb goes online as soon as it finds an API key (``WANDB_API_KEY`` or ``~/.netrc``) and then
    uploads the config and the metrics; a run should do that only when the user asks for it, with
    ``WANDB_MODE=online`` in the environment or in ``ray_kwargs.ray_init.runtime_env.env_vars``.
    """
    environ = os.environ if environ is None else environ
    if "wandb" not in logger_list(loggers) or "WANDB_MODE" in environ or "WANDB_MODE" in (runtime_env_vars or {}):
        return {}
    return {"WANDB_MODE": "offline"}


def keep_wandb_offline_unless_asked(config: DictConfig) -> None:
    """The workers get ``WANDB_MODE=offline`` unless the user set it (only the Ray runtime env changes)."""
    env_vars = OmegaConf.select(config, ENV_VARS) or {}
    for key, value in wandb_env_defaults(config.trainer.logger, env_vars).items():
        OmegaConf.update(config, f"{ENV_VARS}.{key}", value, force_add=True)


def point_loggers_at_run_dir(config: DictConfig) -> Path | None:
    """With ``stapo.run_dir`` set: verl's loggers write there, ``file`` is on, earlier metrics are kept."""
    run_dir = (config.get("stapo") or {}).get("run_dir")
    if not run_dir:
        return None
    run_dir = Path(run_dir).expanduser().resolve()  # the trainer runs in a Ray worker with another cwd
    run_dir.mkdir(parents=True, exist_ok=True)
    rotate_metrics(run_dir)
    env = {
        "VERL_FILE_LOGGER_PATH": str(run_dir / METRICS_NAME),
        "TENSORBOARD_DIR": str(run_dir / TENSORBOARD_NAME),
        "WANDB_DIR": str(run_dir),
    }
    with open_dict(config):
        config.stapo.run_dir = str(run_dir)
        loggers = logger_list(config.trainer.logger)
        if "file" not in loggers:
            config.trainer.logger = loggers + ["file"]
        for key, value in env.items():
            OmegaConf.update(config, f"{ENV_VARS}.{key}", value, force_add=True)
    return run_dir


def logger_pointers(config: DictConfig, run_dir: Path, environ: Mapping[str, str] | None = None) -> list[str]:
    """One line per logger of the run: where its output goes and the command that reads it."""
    environ = os.environ if environ is None else environ
    wandb_mode = (OmegaConf.select(config, ENV_VARS) or {}).get("WANDB_MODE") or environ.get("WANDB_MODE", "online")
    wandb_dir = run_dir / WANDB_NAME
    lines = []
    for name in logger_list(config.trainer.logger):
        if name == "file":
            lines.append(f"[stapo] metrics: {run_dir / METRICS_NAME} (plot: stapo plot {shlex.quote(str(run_dir))})")
        elif name == "tensorboard":
            lines.append(f"[stapo] tensorboard: tensorboard --logdir {shlex.quote(str(run_dir / TENSORBOARD_NAME))}")
        elif name == "wandb" and wandb_mode in ("offline", "dryrun"):
            runs = shlex.quote(str(wandb_dir)) + "/offline-run-*"
            lines.append(f"[stapo] wandb (offline): {wandb_dir}; upload with: wandb sync {runs}")
        elif name == "wandb" and wandb_mode == "disabled":
            lines.append("[stapo] wandb: disabled (WANDB_MODE=disabled), nothing is written")
        elif name == "wandb":
            lines.append(f"[stapo] wandb ({wandb_mode}): local files in {wandb_dir}")
        elif name != "console":
            lines.append(f"[stapo] {name}: not redirected by stapo.run_dir (verl's own default location)")
    return lines


def prepare_loggers(config: DictConfig) -> Path | None:
    """Everything the driver does for logging before verl starts; prints the pointers; returns run_dir."""
    run_dir = point_loggers_at_run_dir(config)
    keep_wandb_offline_unless_asked(config)
    if run_dir is not None:
        for line in logger_pointers(config, run_dir):
            print(line, flush=True)
    return run_dir
