"""Paired runs on the CPU trainer: grpo and stapo runs see identical step-1 rollouts.

Through the real tiny trainer (Ray, verl's v1 sync trainer, FSDP2/gloo, the HF rollout): the same
prompts, the same responses, the same rewards, so a comparison of the two compares algorithms on
common random numbers. docs/reproducibility.md says why this holds. That two launches of one config
give the same numbers at every step, bit for bit, is shown by tests/e2e/test_paired.py (a STAPO run
whose mask removes nothing against the GRPO run: every metric and every rollout of every step) and
by the sweep's paired runs (tests/bench/test_sweep_e2e.py).
"""

from __future__ import annotations

import json

import pytest

from tests.e2e.shared_runs import SharedRun

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

STEPS = [1, 2]


def rollouts_of(folder, step: int) -> list[tuple]:
    """verl's rollout dump of one step (trainer.rollout_data_dir), as sorted (prompt, response, score)."""
    rows = [json.loads(line) for line in (folder / f"{step}.jsonl").read_text().splitlines()]
    return sorted((row["input"], row["output"], row["score"]) for row in rows)


def _dump(shared: SharedRun):
    assert shared.run.returncode == 0, shared.tail()
    assert sorted(shared.steps) == STEPS, shared.tail()
    return shared.run, shared.rollouts


def test_grpo_and_stapo_see_identical_first_rollouts(grpo_run, stapo_run):
    """The shared GRPO and STAPO runs (4 steps; step 1 is before any update, so the step count is no
    difference)."""
    grpo, grpo_dump = _dump(grpo_run)
    stapo, stapo_dump = stapo_run.run, stapo_run.rollouts
    assert stapo.returncode == 0, stapo_run.tail()
    for key in (
        "critic/score/mean",
        "critic/score/max",
        "response_length/mean",
        "response_length/max",
        "prompt_length/mean",
        "training/rollout_probs_diff_max",
    ):
        assert stapo.steps[1][key] == grpo.steps[1][key], key
    rollouts = rollouts_of(stapo_dump, 1)
    assert rollouts == rollouts_of(grpo_dump, 1)
    assert len(rollouts) == 32 and len({response for _, response, _ in rollouts}) > 1
