"""The paper's threshold scope: the mask built per PPO mini-batch, on verl's own split of the update.

Three independent checks:
- the split :class:`MiniBatchSplit` reads against a reference written from torch's DataLoader rules (a
  generator-seeded loader draws its iterator's base seed, then the RandomSampler's permutation), and against
  verl 0.9.1's real ``TrainingWorker.train_mini_batch`` run on a recording stand-in for the FSDP engine (the
  engine needs a model and a device mesh; only which rows each mini-batch holds is recorded, verl's splitting
  code is its own);
- ``fold_shard`` on 1, 2 and 3 real gloo ranks against the whole batch masked one mini-batch at a time in
  one process by the float64 loop references of tests/reference.py;
- the driver's diagnostics (``DriverDiagnostics.diagnose``) silence exactly the tokens the ranks folded.
"""

from __future__ import annotations

import contextlib
import math

import pytest
import torch
from tensordict import TensorDict
from verl.utils import tensordict_utils as tu
from verl.workers.engine_workers import TrainingWorker

from stapo.algorithm.masks import MaskSettings
from stapo.algorithm.validation import STAPOConfigError
from stapo.verl_plugin.training.mini_batches import MiniBatchSplit
from tests.integration.gloo_ranks import run_cases
from tests.integration.mini_batch_ranks import ROWS, SETTINGS, batch_rows, fold_on_rank
from tests.reference import REFERENCES

# float sums whose order of addition differs between the layouts
FLOAT_SUMS = ("grad_bound_spurious", "grad_bound_positive", "grad_bound_share_spurious")


def reference_split(rows: int, per_mini_batch: int, seed: int, shuffle: bool) -> list[list[int]]:
    """Rows of each mini-batch of one rank's first epoch: in order, or a generator-seeded loader's shuffle
    (DataLoader draws its iterator's base seed from the generator, then RandomSampler's randperm)."""
    order = list(range(rows))
    if shuffle:
        g = torch.Generator().manual_seed(seed)
        torch.empty((), dtype=torch.int64).random_(generator=g)
        order = torch.randperm(rows, generator=g).tolist()
    return [order[start : start + per_mini_batch] for start in range(0, rows, per_mini_batch)]


class RecordingEngine:
    """Stand-in for verl's FSDP engine (which needs a model and a device mesh): a DP layout and a train mode."""

    def __init__(self, rank: int, size: int):
        self.rank, self.size = rank, size

    def get_data_parallel_size(self) -> int:
        return self.size

    def get_data_parallel_rank(self) -> int:
        return self.rank

    def train_mode(self, **kwargs):
        return contextlib.nullcontext()

    def is_mp_src_rank_with_outputs(self) -> bool:
        return False


class RecordingWorker:
    """What ``train_mini_batch`` reads of its worker; ``train_batch`` records the rows of each mini-batch."""

    def __init__(self, rank: int, size: int):
        self.engine, self.mini_batches = RecordingEngine(rank, size), []
        self.profiler = type("Profiler", (), {"step": lambda self: None})()

    def train_batch(self, data: TensorDict) -> None:
        self.mini_batches.append(data["row"].tolist())


def verl_trainer_batch(rows: int, mini_batch_size: int, epochs: int, seed: int, shuffle: bool) -> TensorDict:
    """A shard carrying the keys ``RayPPOTrainer._update_actor`` sets (its ``assign_non_tensor`` call)."""
    data = TensorDict({"row": torch.arange(rows)}, batch_size=[rows])
    tu.assign_non_tensor(data, global_batch_size=mini_batch_size, mini_batch_size=mini_batch_size, epochs=epochs,
                         seed=seed, dataloader_kwargs={"shuffle": shuffle})
    return data


def as_mini_batches(index: torch.Tensor, parts: int) -> list[list[int]]:
    return [sorted((index == k).nonzero().flatten().tolist()) for k in range(parts)]


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize(("world", "mini_batch_size"), [(1, 12), (2, 12), (3, 6), (2, 24)])
def test_the_split_is_verls(world, mini_batch_size, shuffle):
    shard_rows = ROWS // world
    for rank in range(world):
        data = verl_trainer_batch(shard_rows, mini_batch_size, 1, 7, shuffle)
        split = MiniBatchSplit.from_batch(data)
        index, parts = split.shard_index(shard_rows, rank, world)
        want = reference_split(shard_rows, mini_batch_size // world, 7 + rank, shuffle)
        assert as_mini_batches(index, parts) == [sorted(rows) for rows in want]
        worker = RecordingWorker(rank, world)
        TrainingWorker.train_mini_batch(worker, data)  # verl's register() wrapper calls the method as it is
        assert worker.mini_batches == want  # verl's own loop trains these rows, in this order
    index, parts = MiniBatchSplit(mini_batch_size, None, 1, 7, shuffle).batch_index(ROWS, world)
    shard_rows = ROWS // world
    expected = [[] for _ in range(parts)]
    for rank in range(world):
        for k, rows in enumerate(reference_split(shard_rows, mini_batch_size // world, 7 + rank, shuffle)):
            expected[k] += [rank * shard_rows + row for row in rows]
    assert as_mini_batches(index, parts) == [sorted(rows) for rows in expected]


def test_num_mini_batch_and_epochs():
    index, parts = MiniBatchSplit(None, 3, 2, 0, False).shard_index(12, 0, 1)
    assert parts == 3 and as_mini_batches(index, parts) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    with pytest.raises(STAPOConfigError, match=r"ppo_epochs > 1 needs actor_rollout_ref.actor.shuffle=false"):
        MiniBatchSplit(12, None, 2, 0, True).shard_index(12, 0, 1)


# --- the fold on real gloo ranks against the loop references --------------------------------------


def reference_by_mini_batch(batch, settings: MaskSettings, mini_batches: list[list[int]]):
    """Each mini-batch's rows masked on their own by the float64 loop reference: per row the folded masks,
    the counts summed and the thresholds averaged over the mini-batches where they are defined."""
    fields = {"response_mask": "response_mask", "advantages": "advantages", "log_prob": "old_log_probs",
              "entropy": "entropy"}
    folded: dict[int, tuple[list[int], list[int]]] = {}
    counts: dict[str, float] = {}
    stats: dict[str, list[float]] = {}
    for rows in mini_batches:
        inputs = {key: [[float(v) for v in batch[name][r]] for r in rows] for key, name in fields.items()}
        inputs["response_mask"] = [[int(v) for v in batch["response_mask"][r]] for r in rows]
        result = REFERENCES[settings.token_mask](inputs, settings.__dict__)
        for i, r in enumerate(rows):
            mask = inputs["response_mask"][i]
            folded[r] = ([m * (not d) for m, d in zip(mask, result["drop_response"][i])],
                         [m * (not d) for m, d in zip(mask, result["drop_count"][i])])
        for key, value in result["counts"].items():
            counts[key] = counts.get(key, 0.0) + value
        for key, value in result["stats"].items():
            stats.setdefault(key, []).append(value)
    means = {key: (sum(d) / len(d) if (d := [v for v in values if not math.isnan(v)]) else math.nan)
             for key, values in stats.items()}
    return folded, counts, means


# (ranks, mini-batch size, shuffled)
RANK_CASES = [(1, 6, True), (2, 12, False), (3, 6, True)]


@pytest.fixture(scope="module")
def folded() -> dict:
    """Every case's ranks, from one start of 3 gloo ranks (tests/integration/gloo_ranks.py)."""
    return run_cases(fold_on_rank, {case: (case[0], case[1:]) for case in RANK_CASES})


@pytest.mark.slow  # starts processes: out of make test-fast
@pytest.mark.parametrize(("world", "mini_batch_size", "shuffle"), RANK_CASES)
def test_every_rank_folds_the_mask_of_its_mini_batch(folded, world, mini_batch_size, shuffle):
    results = folded[(world, mini_batch_size, shuffle)]
    batch, shard_rows = batch_rows(), ROWS // world
    mini_batches = [[] for _ in range(ROWS // mini_batch_size)]
    for rank in range(world):
        for k, rows in enumerate(reference_split(shard_rows, mini_batch_size // world, 3 + rank, shuffle)):
            mini_batches[k] += [rank * shard_rows + row for row in rows]
    for name, settings in SETTINGS.items():
        folded, counts, stats = reference_by_mini_batch(batch, settings, mini_batches)
        for rank in range(world):
            got = results[rank][name]
            rows = range(rank * shard_rows, (rank + 1) * shard_rows)
            assert got["response_mask"] == [folded[r][0] for r in rows], (name, rank)
            assert got["loss_mask"] == [folded[r][1] for r in rows], (name, rank)
            metrics = got["metrics"]
            assert metrics["threshold_scopes"] == len(mini_batches)
            for key, value in counts.items():
                if key == "empty_responses":
                    continue  # counted per row by the fold, per token by the reference's 2-D layout: tested elsewhere
                want = pytest.approx(value, rel=1e-6) if key in FLOAT_SUMS else value
                assert metrics[key] == want, (name, rank, key)
            for key, value in stats.items():
                assert metrics[key] == pytest.approx(value, rel=1e-6, nan_ok=True), (name, rank, key)
        # the scopes matter here: the step's whole batch as one scope silences other tokens
        whole, _, _ = reference_by_mini_batch(batch, settings, [list(range(ROWS))])
        assert any(folded[r] != whole[r] for r in range(ROWS)), name
