"""The recipe writes a generated task on the fly, and rewrites it only when its settings change."""

from __future__ import annotations

import pandas as pd
import pytest

from stapo.data.tasks import TASKS, ensure_task_data
from stapo.models.local import resolve_model_path


def test_written_once_and_rewritten_when_settings_change(tmp_path):
    ensure_task_data(str(tmp_path), 12, 4, 0)
    train = tmp_path / "train.parquet"
    first = pd.read_parquet(train)
    assert len(first) == 12 and len(pd.read_parquet(tmp_path / "val.parquet")) == 4
    assert set(first.columns) >= {"data_source", "prompt", "ability", "reward_model", "extra_info"}
    assert all("\\boxed{}" in row[0]["content"] for row in first["prompt"])
    stamp = train.stat().st_mtime_ns
    ensure_task_data(str(tmp_path), 12, 4, 0)
    assert train.stat().st_mtime_ns == stamp  # same settings: left alone
    ensure_task_data(str(tmp_path), 20, 4, 1)
    second = pd.read_parquet(train)
    assert len(second) == 20 and list(second["reward_model"])[:12] != list(first["reward_model"])


def test_the_arithmetic_task_writes_its_held_out_split(tmp_path):
    ensure_task_data(tmp_path, 10, 5, 0, task="arithmetic")
    assert len(pd.read_parquet(tmp_path / "heldout.parquet")) == 5
    assert set(pd.read_parquet(tmp_path / "train.parquet")["data_source"]) == {"stapo/arithmetic"}


def test_unknown_task_and_model_name_the_setting_and_the_choices(tmp_path):
    with pytest.raises(ValueError, match="stapo.synthetic_task='nope': known tasks are " + ", ".join(TASKS)):
        ensure_task_data(tmp_path, 1, 1, 0, task="nope")
    with pytest.raises(ValueError, match="known local models are stapo://tiny, stapo://smollm2"):
        resolve_model_path("stapo://huge")
    assert resolve_model_path("Qwen/Qwen3-8B-Base") == "Qwen/Qwen3-8B-Base"  # verl's business
