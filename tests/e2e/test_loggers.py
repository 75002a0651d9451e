"""Logger presets (``logger=``) and the start-up pointers to each logger's output, through real composition.

The last test hands the prepared config to verl's own ``Tracking`` (the object verl's trainer logs
through), with the environment the Ray runtime env would give the TaskRunner, logs one step and
checks that every printed pointer names a place that now holds that logger's output.
"""

from __future__ import annotations

import glob
import json
import shlex

import pytest
from omegaconf import OmegaConf

from stapo.verl_plugin.training.loggers import ENV_VARS, prepare_loggers
from tests.recipe_config import recipe_config

PRESETS = {
    "console": ["console"],
    "tensorboard": ["console", "tensorboard"],
    "wandb": ["console", "wandb"],
    "all": ["console", "tensorboard", "wandb"],
}


compose_recipe = recipe_config


@pytest.mark.parametrize("preset", ["tiny", "qwen3_8b"])
@pytest.mark.parametrize("logger", PRESETS)
def test_a_logger_preset_wins_over_the_model_presets_list(preset, logger):
    cfg = compose_recipe(f"model_preset={preset}", f"logger={logger}")
    assert list(cfg.trainer.logger) == PRESETS[logger]


def test_without_a_preset_the_model_preset_decides():
    assert list(compose_recipe("model_preset=tiny").trainer.logger) == ["console"]
    assert list(compose_recipe("model_preset=qwen3_8b").trainer.logger) == ["console", "wandb", "tensorboard"]
    assert list(compose_recipe("logger=all", "trainer.logger=[console]").trainer.logger) == ["console"]


def test_one_pointer_per_logger_when_run_dir_is_set(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    run_dir = tmp_path / "my run"
    cfg = compose_recipe("model_preset=tiny", "logger=all", f"stapo.run_dir={run_dir}")
    assert prepare_loggers(cfg) == run_dir
    assert list(cfg.trainer.logger) == ["console", "tensorboard", "wandb", "file"]
    env = OmegaConf.select(cfg, ENV_VARS)
    assert env.VERL_FILE_LOGGER_PATH == str(run_dir / "metrics.jsonl") and env.WANDB_MODE == "offline"
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        f"[stapo] tensorboard: tensorboard --logdir {shlex.quote(str(run_dir / 'tensorboard'))}",
        f"[stapo] wandb (offline): {run_dir / 'wandb'}; upload with: "
        f"wandb sync {shlex.quote(str(run_dir / 'wandb'))}/offline-run-*",
        f"[stapo] metrics: {run_dir / 'metrics.jsonl'} (plot: stapo plot {shlex.quote(str(run_dir))})",
    ]


def test_no_run_dir_no_pointers_and_a_chosen_wandb_mode_is_kept(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WANDB_MODE", "online")
    cfg = compose_recipe("model_preset=tiny", "logger=wandb")
    assert prepare_loggers(cfg) is None and capsys.readouterr().out == ""
    assert OmegaConf.select(cfg, f"{ENV_VARS}.WANDB_MODE") is None and list(cfg.trainer.logger) == ["console", "wandb"]
    cfg = compose_recipe("model_preset=tiny", "logger=wandb", f"stapo.run_dir={tmp_path}")
    prepare_loggers(cfg)
    assert capsys.readouterr().out.splitlines()[0] == f"[stapo] wandb (online): local files in {tmp_path / 'wandb'}"


def test_the_pointers_name_where_verls_tracking_really_writes(tmp_path, monkeypatch, capsys):
    from verl.utils.tracking import Tracking

    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = compose_recipe("model_preset=tiny", "logger=all", f"stapo.run_dir={tmp_path}")
    prepare_loggers(cfg)
    pointers = capsys.readouterr().out
    for key, value in OmegaConf.select(cfg, ENV_VARS).items():  # what the TaskRunner's environment gets
        monkeypatch.setenv(key, str(value))
    tracking = Tracking("stapo-test", "loggers", default_backend=list(cfg.trainer.logger), config={"trainer": {}})
    tracking.log({"critic/score/mean": 0.5}, step=1)
    tracking.logger["wandb"].finish()
    del tracking  # finishes the file and tensorboard loggers
    assert json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])["step"] == 1
    assert glob.glob(str(tmp_path / "tensorboard" / "events.out.tfevents.*"))
    offline_runs = glob.glob(str(tmp_path / "wandb" / "offline-run-*"))
    assert offline_runs and f"wandb sync {tmp_path / 'wandb'}/offline-run-*" in pointers
