"""`stapo train`: the real recipe (Ray, verl's trainer, FSDP2 over gloo, the HF rollout) on the tiny CPU preset,
through the real CLI in a fresh interpreter, with its one progress line a step read from the run folder."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile

import pytest

from stapo.rundir import read_metrics

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]


def test_stapo_train_runs_the_recipe_with_one_progress_line_a_step_and_an_eta_with_validation(tmp_path):
    ray_tmp = tempfile.mkdtemp(prefix="r", dir="/tmp")  # short: Ray's socket paths are limited
    overrides = ["model_preset=tiny", "trainer.total_training_steps=2", "trainer.test_freq=1", "trainer.save_freq=-1",
                 f"stapo.synthetic_data_dir={tmp_path / 'data'}", "stapo.run_dir=run",  # relative: to the caller's cwd
                 f"trainer.default_local_dir={tmp_path / 'ckpt'}", f"+ray_kwargs.ray_init._temp_dir={ray_tmp}"]
    env = dict(os.environ, WANDB_MODE="offline")
    proc = subprocess.run([sys.executable, "-m", "stapo.cli", "train", *overrides], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=850, check=False)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    out = proc.stdout
    assert "[stapo] preset: model_preset=tiny, algo=stapo" in out
    assert "[stapo] steps: 2, validated every 1 steps and at the last" in out
    lines = [line for line in out.splitlines() if re.match(r"\[stapo\] step \d/2 \|", line)]
    assert len(lines) == 2, out[-3000:]
    # step 1: the validation after step 2 is counted at step 1's measured validation time (timing_s/testing)
    steps = read_metrics(tmp_path / "run")
    assert "timing_s/testing" in steps[1], sorted(steps[1])
    assert "ETA" in lines[0] and "validation" not in lines[0].split("ETA")[1].split("|")[0]
    assert lines[1].split("| ETA ")[1].startswith("0s")
    for word in ("reward", "acc", "entropy", "mask", "s/step"):
        assert word in lines[0], lines[0]
    assert "verl" not in out.split("[train] run folder")[1].split("[train] done")[0].replace("[stapo]", "")
    assert (tmp_path / "run" / "trainer.log").is_file() and "[train] done in" in out
