"""The prompt-group rollout benchmark at its quick size: structure and the work it does, never timings."""

from __future__ import annotations

import math

import torch

from benchmarks import rollout_group


def test_rollout_benchmark_rows_and_table():
    rows = rollout_group.measure(torch.device("cpu"), **rollout_group.SIZES["quick"])
    assert [r["group"] for r in rows] == list(rollout_group.SIZES["quick"]["groups"])
    for r in rows:
        assert r["model"] == "tiny" and r["tokens"] == rollout_group.SIZES["quick"]["max_tokens"]
        assert all(math.isfinite(r[k]) and r[k] > 0 for k in ("single_s_per_sample", "group_s_per_sample", "speedup"))
    table = rollout_group.render(rows)
    assert table.count("\n| ") == len(rows) + 1 and "as a group" in table
    assert "--device cpu" in rollout_group.render(rollout_group.measure(torch.device("meta")))
