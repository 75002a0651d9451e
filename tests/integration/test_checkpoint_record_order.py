"""The STAPO trainer's save records the run around verl's own save (``STAPOTrainer._save_checkpoint``): a run killed
anywhere in a save leaves a ``stapo_run.json`` that agrees with the checkpoint verl would resume.

verl's ``_save_checkpoint`` is replaced by what it leaves on disk (the step's folder, then the tracker naming it),
so the kill can fall between the two; the trainer is the real class, built without verl's start-up.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

from stapo.check import compose_run
from stapo.verl_plugin.preflight.checkpoint_identity import (
    IDENTITY_FILE,
    check_checkpoint_identity,
    driver_view,
    hand_to_trainer,
    run_identity,
)
from stapo.verl_plugin.training.trainer import STAPOTrainer

TRACKER = "latest_checkpointed_iteration.txt"


def composed(folder):
    return compose_run(["model_preset=qwen3_8b", f"trainer.default_local_dir={folder}"])


def trainer_for(folder) -> STAPOTrainer:
    """The trainer with the config the driver hands it, and nothing of verl's start-up."""
    config = driver_view(composed(folder))
    hand_to_trainer(config, run_identity(config))
    trainer = object.__new__(STAPOTrainer)
    trainer.config = config
    return trainer


@pytest.fixture
def verl_save(monkeypatch):
    """verl's save as the files it leaves, killed before its tracker at the steps in ``killed_at``."""
    killed_at: set[int] = set()

    def save(self):
        folder = Path(self.config.trainer.default_local_dir)
        (folder / f"global_step_{self.global_steps}" / "actor").mkdir(parents=True, exist_ok=True)
        if self.global_steps in killed_at:
            raise KeyboardInterrupt  # the kill, before the tracker names the step
        (folder / TRACKER).write_text(str(self.global_steps))

    monkeypatch.setattr(PPOTrainerSync, "_save_checkpoint", save)
    return killed_at


def test_a_run_killed_during_a_save_resumes_its_last_whole_step_as_its_own(tmp_path, verl_save):
    folder = tmp_path / "ckpt"
    trainer = trainer_for(folder)
    trainer.global_steps = 2
    trainer._save_checkpoint()
    verl_save.add(4)
    trainer.global_steps = 4
    with pytest.raises(KeyboardInterrupt):
        trainer._save_checkpoint()
    record = json.loads((folder / IDENTITY_FILE).read_text())
    assert record["steps"] == [2] and record["saving"] == 4
    assert check_checkpoint_identity(composed(folder)) == (
        f"checkpoints: resumes {folder}/global_step_2, saved by this run ({IDENTITY_FILE})")
    # resumed from step 2, it saves step 4 again and goes on
    resumed = trainer_for(folder)
    verl_save.clear()
    for step in (4, 6):
        resumed.global_steps = step
        resumed._save_checkpoint()
    record = json.loads((folder / IDENTITY_FILE).read_text())
    assert record["steps"] == [2, 4, 6] and record["saving"] is None
    assert check_checkpoint_identity(composed(folder)).endswith("global_step_6, saved by this run (stapo_run.json)")
