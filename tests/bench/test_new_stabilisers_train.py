"""The 2026 stabiliser presets (algo=stare, steer, dcpo) train through the real tiny trainer, two steps each.

The smallest run (tests/bench/test_algos_train.py's SMALLEST: 2 prompts x 4 responses, one rank, one mini-batch)
for 2 steps, a checkpoint at step 2: the run exits 0, the policy loss is finite on both steps, the gradient is
non-zero, the saved weights differ from the initial model, and the method's own metric is in the step's metrics.
Each preset's maths is checked in-process against float64 loops (tests/unit/test_stare.py, test_steer.py,
test_dcpo.py) and through verl's loss (tests/integration/test_preset_losses.py); this module proves the plumbing:
the fold of a batch-scoped weight and a new registered loss through Ray, FSDP2 and the rollout.

STARE's gate is on only below its target entropy (0.3, the authors'), which a random tiny model never reaches:
the run raises the target so the weights are applied and counted. Three launches, one at a time (about 1-3
minutes each on the 2-core CI machine).
"""

from __future__ import annotations

import pytest

from tests.bench.test_algos_train import SMALLEST, assert_trained, weights_changed
from tests.e2e.cpu_runs import run_recipe, session_ray

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

PL = "actor_rollout_ref.actor.policy_loss."
TWO_STEPS = [*SMALLEST, "trainer.total_training_steps=2", "trainer.save_freq=2"]
RUNS = {
    "stare": [f"{PL}stare_target_entropy=1000.0"],
    "steer": [],
    "dcpo": [],
}


def own_metric(algo: str, metrics: dict[str, float]) -> None:
    """What the method itself reports on a step (docs/algorithm.md section 7)."""
    if algo == "stare":
        assert metrics["actor/stapo/stare_gate"] == 1.0, metrics
        assert 0 < metrics["actor/stapo/upweighted_frac"] < 1 and metrics["actor/stapo/mean_weight"] > 1, metrics
    elif algo == "steer":
        assert 0 < metrics["actor/stapo/num_downweighted"], metrics
        assert 0.8 <= metrics["actor/stapo/min_weight"] < 1 and metrics["actor/stapo/mean_weight"] < 1, metrics
    else:
        assert 0.5 <= metrics["actor/dcpo/low_bound_mean"] <= 1.0 <= metrics["actor/dcpo/high_bound_mean"], metrics
        assert "actor/dcpo/outside_bounds_frac" in metrics and "actor/stapo/mask_ratio" not in metrics, metrics


@pytest.mark.parametrize("algo", sorted(RUNS))
def test_each_new_stabiliser_trains_two_steps(tmp_path, algo):
    from stapo.models.tiny import build_tiny_model

    run = run_recipe([f"algo={algo}", *TWO_STEPS, *RUNS[algo], f"stapo.run_dir={tmp_path / 'run'}"],
                     tmp_path / "ckpt", cluster=session_ray())  # joins this worker's Ray head: no Ray start
    print(f"[e2e] algo={algo}: 2 steps in {run.seconds:.0f} s")
    assert run.returncode == 0, run.log[-6000:]
    assert sorted(run.steps) == [1, 2], run.log[-6000:]
    assert_trained([run.steps[1], run.steps[2]])
    for step in (1, 2):
        own_metric(algo, run.steps[step])
    assert weights_changed(tmp_path / "ckpt", build_tiny_model(), step=2) > 0
