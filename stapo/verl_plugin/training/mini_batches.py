"""verl's split of an actor update's batch into PPO mini-batches, row by row (the paper's threshold scope).

docs/algorithm.md section 4. verl 0.9.1's ``train_mini_batch`` (verl/workers/engine_workers.py) splits each
DP rank's shard with ``tensordict_utils.make_iterator``: mini-batches of ``mini_batch_size // dp_size`` rows
(or ``shard_rows // num_mini_batch``), in the order of a DataLoader seeded with ``seed + dp_rank``, shuffled
when ``actor.shuffle`` is set, for ``epochs`` passes; mini-batch k of the update is the k-th of every rank.
Micro-batches (dynamic batch size included) only regroup the rows of one mini-batch, so they do not matter here.

:class:`MiniBatchSplit` asks verl's own iterator for that split, from the keys the trainer sets on the batch
(``RayPPOTrainer._update_actor``), so the mask can be built per mini-batch once, before the update: the
workers on their shard, the driver's diagnostics on the whole batch (verl's dispatch hands rank r the r-th
of ``dp_size`` contiguous chunks).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tensordict import TensorDict
from verl.utils import tensordict_utils as tu

from stapo.algorithm.validation import STAPOConfigError


@dataclass(frozen=True)
class MiniBatchSplit:
    """The settings verl splits an update by. ``mini_batch_size`` is global (prompts x ``rollout.n``) rows;
    verl reads ``num_mini_batch`` only when it is not set."""

    mini_batch_size: int | None
    num_mini_batch: int | None
    epochs: int
    seed: int
    shuffle: bool

    @classmethod
    def from_batch(cls, data: TensorDict) -> MiniBatchSplit:
        """The split the trainer asked of this update (read, not popped: verl pops them after the fold)."""
        kwargs = tu.get(data, "dataloader_kwargs", default=None) or {}
        return cls(
            tu.get(data, "mini_batch_size", default=None),
            tu.get(data, "num_mini_batch", default=None),
            int(tu.get(data, "epochs", default=1)),
            int(tu.get(data, "seed", default=42)),
            bool(kwargs.get("shuffle", False)),
        )

    @classmethod
    def from_config(cls, actor, rollout_n: int) -> MiniBatchSplit:
        """The split ``RayPPOTrainer._update_actor`` sets from ``actor_rollout_ref.actor`` and ``rollout.n``."""
        return cls(int(actor.ppo_mini_batch_size) * int(rollout_n), None, int(actor.ppo_epochs),
                   int(actor.data_loader_seed), bool(actor.shuffle))

    def check(self) -> None:
        """A reshuffled epoch has other mini-batches than the first, while the mask is folded once a step."""
        if self.epochs > 1 and self.shuffle:
            raise STAPOConfigError(
                "actor_rollout_ref.actor.policy_loss.threshold_scope=mini_batch with actor.ppo_epochs > 1 needs "
                "actor_rollout_ref.actor.shuffle=false: each epoch would reshuffle the mini-batches while the mask "
                f"is built once a step (got ppo_epochs={self.epochs}, shuffle=true; or set threshold_scope=step)"
            )

    def rows_per_mini_batch(self, shard_rows: int, dp_size: int) -> int:
        if self.mini_batch_size is None:
            return shard_rows // int(self.num_mini_batch)
        return int(self.mini_batch_size) // dp_size

    def shard_index(self, shard_rows: int, dp_rank: int, dp_size: int) -> tuple[torch.Tensor, int]:
        """The mini-batch of each row of rank ``dp_rank``'s shard in the first epoch (verl's own iterator),
        and the number of mini-batches (the same on every rank)."""
        self.check()
        per_rank = self.rows_per_mini_batch(shard_rows, dp_size)
        rows = TensorDict({"row": torch.arange(shard_rows)}, batch_size=[shard_rows])
        batches = tu.make_iterator(rows, mini_batch_size=per_rank, epochs=1, seed=self.seed + dp_rank,
                                   dataloader_kwargs={"shuffle": self.shuffle})
        index = torch.full((shard_rows,), -1, dtype=torch.long)
        count = 0
        for count, batch in enumerate(batches, start=1):
            index[batch["row"]] = count - 1
        if bool((index < 0).any()):
            raise RuntimeError(f"verl's mini-batch iterator left rows of a {shard_rows}-row shard out")
        return index, count

    def batch_index(self, batch_rows: int, dp_size: int) -> tuple[torch.Tensor, int]:
        """The mini-batch of each row of the whole batch: rank r holds the r-th contiguous chunk (verl's
        dispatch), split as :meth:`shard_index` says."""
        chunks = torch.arange(batch_rows).chunk(dp_size)
        if len(chunks) != dp_size or len({len(chunk) for chunk in chunks}) != 1:
            raise RuntimeError(f"a batch of {batch_rows} rows does not split into {dp_size} equal DP shards")
        pieces = [self.shard_index(len(chunk), rank, dp_size) for rank, chunk in enumerate(chunks)]
        return torch.cat([index for index, _ in pieces]), pieces[0][1]


def token_parts(row_index: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """Each token's mini-batch, from its row's (``offsets``: the rows' token bounds, from 0)."""
    return torch.repeat_interleave(row_index, offsets.diff())
