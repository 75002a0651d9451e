"""The gloo ranks of tests/integration/test_mini_batch_scope.py. The ranks' forkserver imports the module of the
function they run (tests/integration/gloo_ranks.py): this one imports what a rank needs (the fold and its
settings), not the test module's verl worker stack, which would cost the server seconds more to import."""

from __future__ import annotations

import torch
from tensordict import TensorDict
from verl.utils import tensordict_utils as tu

from stapo.algorithm.masks import MaskSettings
from stapo.verl_plugin.training.shard_mask import fold_shard
from tests.integration.jagged_rows import response_rows

ROWS = 24
SETTINGS = {
    "stapo": MaskSettings(token_mask="stapo", tau_p=2e-3, entropy_quantile=0.8, threshold_scope="mini_batch"),
    "entropy20": MaskSettings(token_mask="entropy20", entropy_denominator="kept", threshold_scope="mini_batch"),
}


def batch_rows() -> dict[str, list[torch.Tensor]]:
    batch = response_rows(ROWS, seed=11, max_len=60, specials=(1, 2, 3), low_share=0.1)
    del batch["responses"]
    return batch


def nested(rows):
    return torch.nested.as_nested_tensor(rows, layout=torch.jagged)


def fold_on_rank(rank: int, world: int, group, mini_batch_size: int, shuffle: bool) -> dict:
    """One rank's shard folded per mini-batch for every setting (runs in a gloo rank)."""
    batch, shard_rows = batch_rows(), ROWS // world
    start = rank * shard_rows
    out = {}
    for name, settings in SETTINGS.items():
        fields = {key: nested(values[start : start + shard_rows]) for key, values in batch.items()}
        fields["loss_mask"] = nested([m.clone() for m in batch["response_mask"][start : start + shard_rows]])
        data = TensorDict(fields, batch_size=shard_rows)
        tu.assign_non_tensor(data, mini_batch_size=mini_batch_size, epochs=1, seed=3,
                             dataloader_kwargs={"shuffle": shuffle})
        metrics = fold_shard(data, settings, group)
        out[name] = {"response_mask": [t.tolist() for t in data["response_mask"].unbind()],
                     "loss_mask": [t.tolist() for t in data["loss_mask"].unbind()], "metrics": metrics}
    return out
