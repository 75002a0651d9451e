"""main_stapo writes the synthetic task on the fly, and rewrites it only when its settings change."""

from __future__ import annotations

import pandas as pd

from recipe.stapo.main_stapo import ensure_synthetic_data


def test_written_once_and_rewritten_when_settings_change(tmp_path):
    ensure_synthetic_data(str(tmp_path), 12, 4, 0)
    train = tmp_path / "train.parquet"
    first = pd.read_parquet(train)
    assert len(first) == 12 and len(pd.read_parquet(tmp_path / "val.parquet")) == 4
    assert set(first.columns) >= {"data_source", "prompt", "ability", "reward_model", "extra_info"}
    assert all("\\boxed{}" in row[0]["content"] for row in first["prompt"])
    stamp = train.stat().st_mtime_ns
    ensure_synthetic_data(str(tmp_path), 12, 4, 0)
    assert train.stat().st_mtime_ns == stamp  # same settings: left alone
    ensure_synthetic_data(str(tmp_path), 20, 4, 1)
    second = pd.read_parquet(train)
    assert len(second) == 20 and list(second["reward_model"])[:12] != list(first["reward_model"])
