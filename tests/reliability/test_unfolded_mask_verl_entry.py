"""STAPO through verl's own entry point without the STAPO trainer: refused before the first update.

The recipe's driver checks refuse ``token_mask=stapo`` without ``trainer.v1.trainer_mode=stapo``, but a
user can also start verl's ``python -m verl.trainer.main_ppo`` with the preset's keys, where none of
the recipe's code runs on the driver. Then verl's ``sync`` trainer calls the registered loss on the
unfolded mask, which would silently train JustRL. The registered loss itself refuses: the run must
exit non-zero naming ``trainer.v1.trainer_mode`` before any update is taken.

Everything is real: verl's ``main_ppo`` process with the recipe's Hydra config (``--config-path``),
Ray on loopback, verl's sync trainer, FSDP2 over gloo, the rollout, the reward. Only the GPU is absent.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from recipe.stapo.main_stapo import CONF_DIR
from stapo.config_dir import CONFIG_NAME

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(700)]

REPO = Path(__file__).resolve().parents[2]


def test_verls_main_ppo_with_the_stapo_mask_and_verls_sync_trainer_stops_before_the_first_update(tmp_path):
    from stapo.data.tasks import ensure_task_data
    from stapo.models.tiny import build_tiny_model

    data = tmp_path / "data"
    ensure_task_data(data, 16, 4, 0)
    ray_tmp = tempfile.mkdtemp(prefix="r", dir="/tmp")  # short: Ray's socket paths are limited
    args = [
        sys.executable, "-m", "verl.trainer.main_ppo", f"--config-path={CONF_DIR}", f"--config-name={CONFIG_NAME}",
        "model_preset=tiny", "algo=stapo", "trainer.v1.trainer_mode=sync",  # verl's own trainer, not the STAPO one
        f"actor_rollout_ref.model.path={build_tiny_model()}",
        f"data.train_files={data / 'train.parquet'}", f"data.val_files={data / 'val.parquet'}",
        "stapo.synthetic_data_dir=null", "trainer.total_training_steps=1", "trainer.save_freq=-1",
        f"trainer.default_local_dir={tmp_path / 'ckpt'}", f"+ray_kwargs.ray_init._temp_dir={ray_tmp}",
        f"hydra.run.dir={tmp_path / 'hydra'}",
        "trainer.experiment_name=verl-entry",  # the preset's ${hydra:...} name resolves only in the recipe's driver
    ]
    env = dict(os.environ, STAPO_CPU_BACKEND="1", WANDB_MODE="offline", PYTHONUNBUFFERED="1")
    try:
        out = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    log = out.stdout + out.stderr
    assert out.returncode != 0, log[-4000:]
    assert "token_mask=stapo (source=old) reached the loss unfolded" in log, log[-6000:]
    assert "trainer.v1.trainer_mode=stapo" in log
    assert "update_actor" in log  # raised inside the actor update, where every path passes
    # no update was taken: verl logs a step's metrics (actor/pg_loss ...) only after the update
    assert not re.search(r"actor/pg_loss", log), log[-4000:]
    assert not (tmp_path / "ckpt" / "global_step_1").exists()
