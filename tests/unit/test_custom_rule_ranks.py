"""The example rule files on real gloo ranks, folded as the actor workers fold them (``shard_mask.fold_shard``):
each rank's folded masks, weights and metrics equal the built-in S2T's and TACO's bit for bit, the quantile
helper taking its threshold over every rank, over the step's batch and per PPO mini-batch (docs/algorithm.md
sections 4 and 10). One start of 3 ranks runs 1, 2 and 3 (tests/integration/gloo_ranks.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

from tests.integration.gloo_ranks import run_cases
from tests.integration.jagged_rows import response_rows

EXAMPLES = Path(__file__).resolve().parents[2] / "recipe" / "stapo" / "examples"
PAIRS = {"stapo": ("s2t_rule.py", "s2t_rule", "mask"), "taco": ("taco_weight.py", "taco_weight", "weight")}
# a rule's own counts (num_kept) and S2T's own diagnostics (tau_h, quadrants, ...) are each one side's
SHARED_KEYS = ("num_response_tokens", "num_dropped", "num_loss_tokens_expected", "num_zero_advantage",
               "empty_responses", "loss_tokens_folded", "drop_ratio", "nonfinite_entropy", "nonfinite_log_prob",
               "weight_sum", "weight_sum_positive", "mean_weight", "mean_weight_positive", "min_weight",
               "num_positive_downweighted", "num_downweighted", "positive_downweighted_frac", "threshold_scopes")


def _batch() -> dict[str, list[torch.Tensor]]:
    batch = response_rows(30, seed=11, max_len=90, specials=(1, 2, 3), low_share=0.1)
    del batch["responses"]
    return batch


def _shard(batch, start: int, end: int) -> TensorDict:
    def nested(rows):
        return torch.nested.as_nested_tensor(rows, layout=torch.jagged)

    fields = {name: nested(values[start:end]) for name, values in batch.items()}
    fields["loss_mask"] = nested([m.clone() for m in batch["response_mask"][start:end]])
    return TensorDict(fields, batch_size=end - start)


def _fold_both(rank: int, world: int, group) -> dict:
    """Every pair folded on this rank's shard: the built-in and the file, by step and per mini-batch."""
    from unittest import mock

    from stapo.algorithm.masks import MaskSettings
    from stapo.verl_plugin.training import shard_mask
    from stapo.verl_plugin.training.custom_rule import RuleSetting, register_rule
    from stapo.verl_plugin.training.jagged import TOKEN_WEIGHT

    batch = _batch()
    rows = len(batch["response_mask"])
    cuts = [round(rows * r / world) for r in range(world + 1)]
    start, end = cuts[rank], cuts[rank + 1]
    out = {}
    for builtin, (file, name, kind) in PAIRS.items():
        custom = register_rule(RuleSetting(str(EXAMPLES / file), name, {}, kind))
        for scope in ("step", "mini_batch"):
            folded = {}
            for token_mask in (builtin, custom):
                data = _shard(batch, start, end)
                settings = MaskSettings(token_mask=token_mask, threshold_scope=scope)
                # three mini-batches, rows interleaved (a shuffled split), the same on every rank
                index = torch.arange(end - start) % 3
                with mock.patch.object(shard_mask.MiniBatchSplit, "from_batch") as split:
                    split.return_value.shard_index.return_value = (index, 3)
                    metrics = shard_mask.fold_shard(data, settings, group)
                folded[token_mask] = {
                    "response_mask": data["response_mask"].values().tolist(),
                    "loss_mask": data["loss_mask"].values().tolist(),
                    "weight": data[TOKEN_WEIGHT].values().tolist() if TOKEN_WEIGHT in data.keys() else None,
                    "metrics": {k: v for k, v in metrics.items() if k in SHARED_KEYS},
                    "dropped": metrics["num_dropped"],
                }
            out[(builtin, scope)] = (folded[builtin], folded[custom])
    return out


CASES = {1: (1, ()), 2: (2, ()), 3: (3, ())}


@pytest.fixture(scope="module")
def folded() -> dict:
    return run_cases(_fold_both, CASES)


@pytest.mark.slow  # starts processes: out of make test-fast
@pytest.mark.parametrize("world", [1, 2, 3])
def test_the_rule_files_fold_as_the_builtin_rules_on_every_rank(folded, world):
    for rank, result in enumerate(folded[world]):
        for (builtin, scope), (want, got) in result.items():
            assert got == want, (world, rank, builtin, scope)
    # the thresholds are over every rank: the step's batch drops the same tokens however it is sharded
    totals = {world: folded[world][0][("stapo", "step")][1]["dropped"] for world in folded}
    assert len(set(totals.values())) == 1 and totals[1] > 0, totals
