"""The vectorised validation bootstrap against verl's own loop: equal bit for bit, or declined.

The reference is verl's ``bootstrap_metric`` itself (one ``np.max`` / ``np.min`` call per resampled row, on an
object array); the checked code reduces a float64 matrix along its rows. Fresh random inputs each case, with
ties, a single value, infinities, bools, ints and numpy scalars; the cases the vectorised path must decline
(NaN, -0.0, strings, None, a majority vote) fall back to verl's loop.
"""

from __future__ import annotations

import random
from functools import partial

import numpy as np
import pytest
from verl.trainer.ppo import metric_utils

from stapo.eval.bootstrap import best_worst_bootstrap
from stapo.verl_plugin.training import val_bootstrap

VERL_BOOTSTRAP = getattr(metric_utils.bootstrap_metric, "verl_bootstrap_metric", metric_utils.bootstrap_metric)
BEST_WORST = [np.max, np.min]


def _values(kind: str, rng: random.Random, n: int) -> list:
    if kind == "acc":
        return [float(rng.random() < 0.6) for _ in range(n)]
    if kind == "score":
        return [rng.choice([1.0, -1.0]) for _ in range(n)]
    if kind == "ties":
        return [rng.choice([0.25, 0.5, 0.5, 3.0]) for _ in range(n)]
    if kind == "floats":
        return [rng.gauss(0, 1) for _ in range(n)]
    if kind == "ints":
        return [rng.randint(-3, 3) for _ in range(n)]
    if kind == "bools":
        return [rng.random() < 0.5 for _ in range(n)]
    if kind == "numpy":
        return [np.float32(rng.gauss(0, 1)) for _ in range(n)]
    if kind == "inf":
        return [rng.choice([float("inf"), -float("inf"), 1.0]) for _ in range(n)]
    raise ValueError(kind)


@pytest.mark.parametrize("kind", ["acc", "score", "ties", "floats", "ints", "bools", "numpy", "inf"])
@pytest.mark.parametrize("n_data", [1, 3, 8])
def test_equal_to_verls_loop_bit_for_bit_and_leaves_the_generator_where_verl_does(kind, n_data):
    rng = random.Random(f"{kind}-{n_data}")
    for subset_size, n_bootstrap, seed in [(2, 1000, 42), (n_data, 1000, 42), (8, 37, rng.randrange(10**6))]:
        data = _values(kind, rng, n_data)
        for fns in (BEST_WORST, [np.min], [np.amax, np.amin]):
            expected = VERL_BOOTSTRAP(data, subset_size, fns, n_bootstrap, seed)
            state_after_verl = np.random.get_state()[1].copy()
            got = best_worst_bootstrap(data, subset_size, fns, n_bootstrap, seed)
            assert np.array(got).tobytes() == np.array(expected).tobytes()  # bit for bit, NaN (inf - inf) too
            assert all(isinstance(value, float) for pair in got for value in pair)
            np.testing.assert_array_equal(np.random.get_state()[1], state_after_verl)


@pytest.mark.parametrize(
    "data, fns",
    [
        ([1.0, float("nan"), 0.0], BEST_WORST),
        ([0.0, -0.0, 1.0], BEST_WORST),
        (["a", "b"], BEST_WORST),
        ([1.0, None], BEST_WORST),
        ([], BEST_WORST),
        ([1.0, 2.0], [np.mean]),
        ([{"val": 1.0, "pred": "2"}, {"val": 0.0, "pred": "3"}],
         [partial(metric_utils.calc_maj_val, vote_key="pred", val_key="val")]),
    ],
    ids=["nan", "negative-zero", "strings", "none", "empty", "mean", "majority-vote"],
)
def test_declines_what_it_could_not_match_and_the_installed_function_then_runs_verls(data, fns, monkeypatch):
    assert best_worst_bootstrap(data, 2, fns) is None
    monkeypatch.setattr(metric_utils, "bootstrap_metric", VERL_BOOTSTRAP)
    val_bootstrap.install()
    assert metric_utils.bootstrap_metric is not VERL_BOOTSTRAP
    try:
        expected = VERL_BOOTSTRAP(data, 2, fns, 50, 42)
    except Exception as verls_error:  # verl's own loop fails on some (empty, None, strings): so does the installed
        with pytest.raises(type(verls_error)):
            metric_utils.bootstrap_metric(data, 2, fns, 50, 42)
        return
    got = metric_utils.bootstrap_metric(data, 2, fns, 50, 42)
    assert np.array(got).tobytes() == np.array(expected).tobytes()  # NaN where verl's is NaN


def _validation(rng: random.Random, with_pred: bool):
    """A validation's per-sample lists as verl's trainer passes them: 2 sources, 10 prompts, 5-8 samples each."""
    sources, uids, infos = [], [], {"acc": [], "score": [], "reward": []}
    if with_pred:
        infos["pred"] = []
    for prompt in range(10):
        for _ in range(rng.choice([5, 8, 8])):
            right = rng.random() < 0.55
            sources.append(f"stapo/source{prompt % 2}")
            uids.append(f"uid-{prompt}")
            infos["acc"].append(float(right))
            infos["score"].append(1.0 if right else -1.0)
            infos["reward"].append(rng.gauss(0, 1))
            if with_pred:
                infos["pred"].append(str(rng.randint(0, 3)))
    return sources, uids, infos


@pytest.mark.parametrize("with_pred", [False, True])
def test_verls_validation_metrics_are_the_same_values_with_it_installed(with_pred, monkeypatch):
    sources, uids, infos = _validation(random.Random(with_pred), with_pred)
    monkeypatch.setattr(metric_utils, "bootstrap_metric", VERL_BOOTSTRAP)
    expected = metric_utils.process_validation_metrics(sources, uids, infos)
    val_bootstrap.install()
    installed = metric_utils.bootstrap_metric
    val_bootstrap.install()  # a second install keeps the first
    assert metric_utils.bootstrap_metric is installed and installed.verl_bootstrap_metric is VERL_BOOTSTRAP
    got = metric_utils.process_validation_metrics(sources, uids, infos)
    as_plain = lambda nested: {s: {v: dict(m) for v, m in by_var.items()} for s, by_var in nested.items()}  # noqa: E731
    assert as_plain(got) == as_plain(expected)
    assert any(name.startswith("best@8") for name in got["stapo/source0"]["acc"])
    assert ("maj@8/mean" in got["stapo/source0"]["acc"]) == with_pred
