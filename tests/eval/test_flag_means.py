"""The reward flags' validation means (stapo.eval.val_metrics.flag_means) against verl's own ``mean@n`` on the same
inputs: the trainer takes the flags out of verl's bootstrap, and their logged means must not change."""

from __future__ import annotations

import random

import numpy as np
import pytest
from verl.trainer.ppo.metric_utils import process_validation_metrics

from stapo.eval.val_metrics import FLAG_KEYS, flag_means


@pytest.mark.parametrize("seed", range(3))
def test_flag_means_are_verls_mean_at_n(seed):
    rng = random.Random(seed)
    sources, uids, infos = [], [], {key: [] for key in FLAG_KEYS}
    for source in ("stapo/addition", "stapo/math500"):
        for prompt in range(rng.randint(2, 6)):
            for _ in range(8):
                sources.append(source)
                uids.append(f"{source}-{prompt}")
                for key in FLAG_KEYS:
                    infos[key].append(float(rng.random() < 0.3))
    ours = flag_means(sources, uids, infos)
    verls = process_validation_metrics(sources, uids, infos, seed=42)
    expected = {f"val-aux/{source}/{key}/{stat}@8": verls[source][key][f"{stat}@8"]
                for source in verls for key in FLAG_KEYS for stat in ("mean", "std")}
    assert ours.keys() == expected.keys()
    for key, value in expected.items():
        assert ours[key] == pytest.approx(value, rel=1e-12), key
    # and by hand: the mean over prompts of each prompt's mean
    mask = [s == "stapo/addition" for s in sources]
    values = np.array(infos["checker_strict"])[mask].reshape(-1, 8)
    assert ours["val-aux/stapo/addition/checker_strict/mean@8"] == pytest.approx(values.mean(axis=1).mean())


def test_no_flags_no_metrics_and_none_values_skipped():
    assert flag_means(["s"], ["u"], {"acc": [1.0]}) == {}
    out = flag_means(["s", "s"], ["u", "u"], {"has_answer": [1.0, None]})
    assert out == {"val-aux/s/has_answer/mean@1": 1.0, "val-aux/s/has_answer/std@1": 0.0}
