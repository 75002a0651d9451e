"""A prompt group's trajectories put into TransferQueue in one call, not one call a sample.

verl's TransferQueue agent-loop worker (``verl.trainer.ppo.v1.agent_loop_tq``) turns each finished sample into a
one-row TensorDict (``list_of_dict_to_tensordict``) and puts it with its own ``async_kv_batch_put``, then, once
all of the prompt's samples have settled, puts the group's terminal status (``finished`` or ``failure``), which
is what the replay buffer waits for. In a profile of a CPU testbed run those puts were about two fifths of the
worker's busy time (docs/benchmarks-history.md, "the agent-loop worker's hops"): 64 puts a testbed step, 512 a
validation, each a
round trip to the storage unit and the controller.

``install`` (in an agent-loop worker's process) replaces the two names that module looks up when it stores a
sample: the converter now keeps the sample's row as it is (``Rows``), and ``tq`` is a ``GroupedPuts`` that holds a
group's rows until verl puts the group's terminal status, then converts and puts them all in one
``async_kv_batch_put`` just before it. verl's code runs unchanged: the same rows, keys and tags reach the same
storage before the same status, in the same order, so what the replay buffer reads is what it read before (a
group's rows of unequal length are stored from one jagged column instead of one row each: the same values). Every
other call passes through to TransferQueue.

Off by default (``stapo.tq_group_puts=true`` turns it on): in 20-step testbed runs on 2 cores it gave the same numbers
and was not told apart from verl's per-sample puts (docs/benchmarks-history.md, "a group's samples put at once"). It
changes when
a sample becomes visible in TransferQueue (with its group's status, not before), which only a consumer reading
samples before their group finished would see: verl's sync trainer does not.
"""

from __future__ import annotations

from typing import Any

SETTING = "stapo.tq_group_puts"
TERMINAL = frozenset({"finished", "failure"})


class Rows(list):
    """Sample rows (dicts of tensors and values) not yet turned into a TensorDict."""


class GroupedPuts:
    """TransferQueue's client module, with each group's sample puts held until its terminal status is put."""

    def __init__(self, tq, convert):
        self._tq = tq
        self._convert = convert  # verl's list_of_dict_to_tensordict
        # (partition, uid) -> (keys, rows, tags) of the samples put so far, in the order they were put
        self.held: dict[tuple[str, str], tuple[list, Rows, list]] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tq, name)

    async def async_kv_batch_put(self, keys, partition_id, fields=None, tags=None, **kwargs):
        if not isinstance(fields, Rows) or kwargs or not fields:
            return await self._tq.async_kv_batch_put(keys=keys, partition_id=partition_id, fields=self.tensors(fields),
                                                     tags=tags, **kwargs)
        uid = fields[0]["uid"]
        held_keys, held_rows, held_tags = self.held.setdefault((partition_id, uid), ([], Rows(), []))
        held_keys.extend(keys)
        held_rows.extend(fields)
        held_tags.extend(tags if tags is not None else [{}] * len(keys))
        return None  # verl's worker does not read what the put returns

    async def async_kv_put(self, key, partition_id, fields=None, tag=None, **kwargs):
        if (tag or {}).get("status") in TERMINAL:
            await self.flush(partition_id, key)
        return await self._tq.async_kv_put(key=key, partition_id=partition_id, fields=fields, tag=tag, **kwargs)

    async def flush(self, partition_id: str, uid: str) -> None:
        """Put the rows held for ``uid``'s group, if any, as one batch."""
        held = self.held.pop((partition_id, uid), None)
        if held is not None:
            keys, rows, tags = held
            await self._tq.async_kv_batch_put(keys=keys, partition_id=partition_id, fields=self.tensors(rows),
                                              tags=tags)

    def tensors(self, fields):
        return self._convert(list(fields)) if isinstance(fields, Rows) else fields


def install(module) -> GroupedPuts:
    """Group the sample puts of verl's TransferQueue agent-loop module ``module`` in this process (once)."""
    if isinstance(module.tq, GroupedPuts):
        return module.tq
    module.tq = GroupedPuts(module.tq, module.list_of_dict_to_tensordict)
    module.list_of_dict_to_tensordict = Rows
    return module.tq


def wanted(config) -> bool:
    from omegaconf import OmegaConf

    return bool(OmegaConf.select(config, SETTING, default=False))
