"""`stapo train`: the real recipe (Ray, verl's trainer, FSDP2 over gloo, the HF rollout) on the tiny CPU preset,
through the real CLI in a fresh interpreter, with its one progress line a step read from the run folder.

The run is the suite's shared ``silent_stapo_train_run`` (tests/e2e/shared_runs.py: `stapo train` in a folder of its
own, a relative run folder, 2 steps validated after each), whose numbers tests/e2e/test_paired.py compares with GRPO's:
one launch for both modules' checks. It joins the pytest process's Ray head (RAY_ADDRESS and the JOIN overrides of
tests/e2e/cpu_runs.py, passed on by the command as given)."""

from __future__ import annotations

import re

import pytest

from stapo.rundir import read_metrics

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]


def test_stapo_train_runs_the_recipe_with_one_progress_line_a_step_and_an_eta_with_validation(
        silent_stapo_train_run):
    shared = silent_stapo_train_run
    assert shared.overrides[0] == "model_preset=tiny" and "stapo.run_dir=run" in shared.overrides  # relative: the cwd's
    run = shared.run
    assert run.returncode == 0, run.log[-4000:]
    out = run.log
    assert "[stapo] preset: model_preset=tiny, algo=stapo" in out
    assert "[stapo] steps: 2, validated every 1 steps and at the last" in out
    lines = [line for line in out.splitlines() if re.match(r"\[stapo\] step \d/2 \|", line)]
    assert len(lines) == 2, out[-3000:]
    # step 1: the validation after step 2 is counted at step 1's measured validation time (timing_s/testing)
    steps = read_metrics(shared.run_dir)
    assert "timing_s/testing" in steps[1], sorted(steps[1])
    assert "ETA" in lines[0] and "validation" not in lines[0].split("ETA")[1].split("|")[0]
    assert lines[1].split("| ETA ")[1].startswith("0s")
    for word in ("reward", "acc", "entropy", "mask", "s/step"):
        assert word in lines[0], lines[0]
    assert "verl" not in out.split("[train] run folder")[1].split("[train] done")[0].replace("[stapo]", "")
    assert (shared.run_dir / "trainer.log").is_file() and "[train] done in" in out
