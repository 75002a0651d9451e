"""A resumed run's metrics segments merged step by step: at a step both segments logged, the later record is the
step's record whole, so no value of the earlier segment survives beside the later one's (a resume that does not
reproduce the run bit for bit, on another CPU kind, would otherwise mix two runs at one step)."""

from __future__ import annotations

import gzip
import json

from stapo.rundir import read_metrics
from stapo.runs.folder import load_run
from stapo.runs.summary import summarize_run


def _lines(records) -> str:
    return "".join(json.dumps({"step": step, "data": data}) + "\n" for step, data in records)


def write_resumed_run(folder, gzipped: bool = False):
    """A run killed after step 3 and resumed from its step-2 checkpoint: step 3 logged by both segments, which
    disagree there, and the earlier segment's step 3 carries a key the later one did not log."""
    folder.mkdir(parents=True)
    earlier = [
        (1, {"val/acc": 0.1, "actor/entropy": 1.0}),
        (2, {"val/acc": 0.2, "actor/entropy": 1.1}),
        (3, {"val/acc": 0.9, "actor/entropy": 9.0, "actor/stapo/entropy_max": 50.0}),
    ]
    later = [(3, {"val/acc": 0.3, "actor/entropy": 1.2}), (4, {"val/acc": 0.4, "actor/entropy": 1.3})]
    if gzipped:
        (folder / "metrics.prev-1.jsonl.gz").write_bytes(gzip.compress(_lines(earlier).encode(), mtime=0))
        (folder / "metrics.jsonl.gz").write_bytes(gzip.compress(_lines(later).encode(), mtime=0))
    else:
        (folder / "metrics.prev-1.jsonl").write_text(_lines(earlier))
        (folder / "metrics.jsonl").write_text(_lines(later))


def test_the_later_segments_record_of_a_step_replaces_the_earlier_one_whole(tmp_path):
    for gzipped in (False, True):
        folder = tmp_path / f"gz-{gzipped}" / "stapo-seed1"
        write_resumed_run(folder, gzipped)
        steps = read_metrics(folder)
        assert list(steps) == [1, 2, 3, 4]
        assert steps[3] == {"val/acc": 0.3, "actor/entropy": 1.2}  # no entropy_max of the earlier segment
        assert steps[2] == {"val/acc": 0.2, "actor/entropy": 1.1}  # a step only the earlier segment logged stays


def test_lines_of_one_step_in_one_segment_still_join(tmp_path):
    """verl may log a step in several lines of one file (a validation line beside the training line): within a
    segment they are one record; a later segment's record of that step still replaces all of it."""
    (tmp_path / "metrics.prev-1.jsonl").write_text(_lines([(5, {"a": 1.0}), (5, {"b": 2.0}), (6, {"a": 6.0})]))
    (tmp_path / "metrics.jsonl").write_text(_lines([(6, {"b": 7.0}), (6, {"c": 8.0})]))
    steps = read_metrics(tmp_path)
    assert steps == {5: {"a": 1.0, "b": 2.0}, 6: {"b": 7.0, "c": 8.0}}


def test_the_comparison_reads_the_later_segment_at_the_resumed_step(tmp_path):
    """What the comparisons see: the earlier segment's entropy spike and largest-position entropy at step 3 are
    gone with the record they were in."""
    folder = tmp_path / "stapo-seed1"
    write_resumed_run(folder)
    summary = summarize_run(load_run(folder))
    assert summary.values["entropy_peak"] == 1.3 and summary.values["entropy_max_peak"] is None
    assert summary.series["entropy"] == {1: 1.0, 2: 1.1, 3: 1.2, 4: 1.3}
