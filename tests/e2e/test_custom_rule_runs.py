"""A rule from a file trains exactly as the built-in rule it reimplements, through the real CPU trainer (Ray,
FSDP2 on two gloo ranks, the HF rollout): every metric both runs log and every rollout equal, step for step,
bit for bit (docs/algorithm.md section 10).

- recipe/stapo/examples/s2t_rule.py (S2T through the ``quantile`` helper, per mini-batch over both ranks)
  against the suite's shared two-rank STAPO run (tests/e2e/shared_runs.py: two shuffled mini-batches a step,
  Lopti on): one new launch; the silenced-token log and the token sample are equal too.
- recipe/stapo/examples/taco_weight.py against algo=taco, both on two ranks: two new launches.

The file is loaded in the driver, the TaskRunner and both actor workers from the job's environment (a worker
without it could not name ``custom:s2t_rule``: the run would fail, not differ).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tests.e2e.shared_runs import STAPO_TWO_RANKS, SharedRun, launch
from tests.e2e.test_reproducible import rollouts_of

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1500)]

EXAMPLES = Path(__file__).resolve().parents[2] / "recipe" / "stapo" / "examples"
STEPS = [1, 2]
MACHINE = ("timing_s/", "timing_per_token_ms/", "perf/", "actor/perf/")
# S2T's own diagnostics (its threshold, candidates, quadrants, bound): a rule from a file reports what every rule
# reports (its counts, mask_ratio, keep_ratio), not S2T's internals
S2T_ONLY = ("actor/stapo/tau_h", "actor/stapo/num_spurious", "actor/stapo/num_candidates",
            "actor/stapo/num_candidates_local", "actor/stapo/num_positive", "actor/stapo/num_positive_low_prob",
            "actor/stapo/positive_low_prob_frac", "actor/stapo/grad_bound_spurious",
            "actor/stapo/grad_bound_positive", "actor/stapo/grad_bound_share_spurious",
            "actor/stapo/quadrant", "actor/stapo/quadrant_entropy_split", "actor/stapo/entropy_p")
RULE_ONLY = ("actor/stapo/num_kept", "actor/stapo/keep_ratio")


def _rule(file: str, name: str) -> list[str]:
    return [f"stapo.custom_rule.path={EXAMPLES / file}", f"stapo.custom_rule.name={name}"]


def _finished(shared: SharedRun) -> dict[int, dict[str, float]]:
    assert shared.run.returncode == 0, shared.tail()
    assert sorted(shared.steps) == STEPS, shared.tail()
    return {step: {k: v for k, v in m.items() if not k.startswith(MACHINE)} for step, m in shared.steps.items()}


def _same(a: float, b: float) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def assert_same_run(builtin: SharedRun, rule: SharedRun, builtin_only=(), rule_only=()) -> None:
    """Every metric both log equal at every step; the keys only one logs are the expected ones; the rollouts of
    every step equal."""
    want, got = _finished(builtin), _finished(rule)
    for step in STEPS:
        extra = {k for k in want[step].keys() - got[step].keys() if not k.startswith(builtin_only)}
        missing = {k for k in got[step].keys() - want[step].keys() if not k.startswith(rule_only)}
        assert not extra and not missing, (step, sorted(extra), sorted(missing))
        differ = {k: (want[step][k], got[step][k]) for k in want[step].keys() & got[step].keys()
                  if not _same(want[step][k], got[step][k])}
        assert not differ, (step, differ)
        assert rollouts_of(builtin.rollouts, step) == rollouts_of(rule.rollouts, step), step


def test_the_s2t_rule_file_trains_as_algo_stapo(stapo_two_ranks_run, tmp_path):
    rule = launch(tmp_path / "rule", [*STAPO_TWO_RANKS, *_rule("s2t_rule.py", "s2t_rule")], run_dir=True,
                  rollouts=True)
    assert_same_run(stapo_two_ranks_run, rule, S2T_ONLY, RULE_ONLY)
    stapo = stapo_two_ranks_run.steps
    for step in STEPS:
        metrics = rule.steps[step]
        assert metrics["actor/stapo/num_dropped"] == stapo[step]["actor/stapo/num_spurious"]
        assert metrics["actor/stapo/driver_mask_diff"] == 0 and metrics["actor/stapo/threshold_scopes"] == 2
    assert any(stapo[step]["actor/stapo/num_spurious"] > 0 for step in STEPS)
    # the run folder: the rule named, the same silenced tokens logged and the same token sample
    assert "token_mask: custom:s2t_rule" in (rule.run_dir / "config.yaml").read_text()
    for name in ("spurious_tokens.jsonl", "token_samples.jsonl"):
        want = (stapo_two_ranks_run.run_dir / name).read_text()
        assert want and (rule.run_dir / name).read_text() == want, name
    assert "custom rule" in rule.run.log and "a mask, keep ratio" in rule.run.log


def test_the_taco_weight_file_trains_as_algo_taco(tmp_path):
    common = ["trainer.n_gpus_per_node=2", "trainer.total_training_steps=2", "trainer.save_freq=-1",
              "actor_rollout_ref.actor.ppo_mini_batch_size=2"]
    taco = launch(tmp_path / "taco", ["algo=taco", *common], rollouts=True)
    # the rule replaces the preset's: algo=stapo's S2T gives way to the weight
    rule = launch(tmp_path / "rule", ["algo=stapo", *common, *_rule("taco_weight.py", "taco_weight")], rollouts=True)
    assert_same_run(taco, rule)
    for step in STEPS:
        metrics = rule.steps[step]
        assert 0 < metrics["actor/stapo/num_positive_downweighted"] and metrics["actor/stapo/min_weight"] < 1
        assert "actor/stapo/num_spurious" not in metrics
    assert "a weight, mean weight" in rule.run.log
