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


def _write_many(path, barrier, rounds: int) -> None:
    from stapo.data.rows import write_rows

    rows = [{"data_source": "x", "prompt": [{"role": "user", "content": str(i)}]} for i in range(500)]
    barrier.wait()
    for _ in range(rounds):
        write_rows(path, rows)


def test_writers_side_by_side_on_one_file_all_succeed(tmp_path):
    """A sweep's first runs start together and each prepares the shared data folder: on a fresh machine the second
    writer's rename once failed (both wrote one temporary name). Four processes, released together by a barrier,
    each write the same file 10 times: none fails, the file is whole, no temporary file is left."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    barrier, path = context.Barrier(4), tmp_path / "train.parquet"
    writers = [context.Process(target=_write_many, args=(path, barrier, 10)) for _ in range(4)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(timeout=240)
    assert [writer.exitcode for writer in writers] == [0, 0, 0, 0]
    assert len(pd.read_parquet(path)) == 500 and [p.name for p in tmp_path.iterdir()] == ["train.parquet"]


def test_writers_side_by_side_on_one_task_folder_write_what_one_writer_writes(tmp_path):
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(3) as pool:
        pool.starmap(ensure_task_data, [(tmp_path / "shared", 300, 64, 0, "addition")] * 3)
    ensure_task_data(tmp_path / "alone", 300, 64, 0, "addition")
    for name in ("train.parquet", "heldout.parquet", "stapo_synthetic.json"):
        assert (tmp_path / "shared" / name).read_bytes() == (tmp_path / "alone" / name).read_bytes(), name
    assert len(list((tmp_path / "shared").iterdir())) == 3  # no temporary file left behind
