"""verl's sync replay buffer with the batch in submission order instead of completion order.

verl 0.9.1's ``ReplayBuffer._materialize_batch`` lists a step's trajectories in the order their
keys first reached TransferQueue, i.e. the order in which the rollouts (and their rewards)
finished; ``_select_prompt_uids`` sorts a ``set`` of uuid4 keys. Both depend on timing and on
the process's string hashing, and the batch order decides the micro-batches and the order of
every floating-point sum in the update. Here the trajectories come in the order the prompts were
submitted (the dataloader's order: TransferQueue lists keys in first-insertion order and the
trainer inserts every prompt key, in batch order, before generation), then by sample
(``session_id``) and output index.

Plugged in with verl's own hook: ``trainer.v1.sampler.custom_sampler.path=pkg://stapo.verl_plugin.reproducible.replay_order``
and ``...custom_sampler.name=SubmissionOrderReplayBuffer``. verl gives a custom sampler only the
base arguments (no DAPO group filtering, no failed-group refill), so it is for the plain sync
trainer; ``stapo.verl_plugin.cpu.enable_for_run`` installs it only then.
"""

from __future__ import annotations

from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

SAMPLER_PATH = "pkg://stapo.verl_plugin.reproducible.replay_order"
SAMPLER_NAME = "SubmissionOrderReplayBuffer"


def trajectory_order(keys: list[str], prompt_order: list[str]) -> list[int]:
    """Positions of ``keys`` (``{uid}_{session_id}_{index}``) sorted by (prompt submission, session, index).

    Raises on a key whose prompt is not in ``prompt_order``: an order made up for it would again
    depend on timing.
    """
    rank = {uid: position for position, uid in enumerate(prompt_order)}

    def sort_key(position: int) -> tuple[int, int, int]:
        uid, session, index = keys[position].rsplit("_", 2)
        if uid not in rank:
            raise KeyError(f"trajectory {keys[position]!r}: its prompt {uid!r} was never submitted")
        return rank[uid], int(session), int(index)

    return sorted(range(len(keys)), key=sort_key)


# verl's sync buffer checks for finished rollouts every 2 s: a tiny model's generation (0.3 s of compute
# for 64 samples) then takes 2 or 4 s a step. Each poll is one metadata read from TransferQueue's
# controller; 0.1 s costs at most a few such reads per second of a GPU step that lasts minutes.
POLL_INTERVAL_S = 0.1


class SubmissionOrderReplayBuffer(ReplayBuffer):
    """``ReplayBuffer`` (sync) whose selection and batches follow the order prompts were submitted,
    polling for finished rollouts every ``POLL_INTERVAL_S``."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("poll_interval", POLL_INTERVAL_S)
        super().__init__(*args, **kwargs)

    def _validate_mode_config(self) -> None:
        super()._validate_mode_config()
        if self.trainer_mode != "sync":
            raise ValueError(
                f"{SAMPLER_NAME} is a sync replay buffer; trainer mode {self.trainer_mode!r} needs verl's "
                "ReplayBufferAsync (unset trainer.v1.sampler.custom_sampler)"
            )

    def _select_prompt_uids(self, partition_id: str, sampleable_keys: set[str], batch_size: int):
        steps = dict(self.prompt_global_steps[partition_id])  # insertion (= submission) order
        order = {uid: position for position, uid in enumerate(steps)}
        ordered = sorted(sampleable_keys, key=lambda uid: (steps.get(uid, 0), order.get(uid, len(order))))
        return ordered[:batch_size], dict(self.partitions[partition_id]), steps

    def _materialize_batch(self, partition_id: str, selected_prompt_uids: list[str], partition_snapshot: dict):
        submitted = [uid for uid in self.prompt_global_steps[partition_id] if uid in set(selected_prompt_uids)]
        batch = super()._materialize_batch(partition_id, selected_prompt_uids, partition_snapshot)
        batch.reorder(trajectory_order(list(batch.keys), submitted))
        return batch
