"""The archive's readers (stapo/runs/archive.py) and `stapo plot` over an archived set: a large JSON kept gzipped
reads as the plain file did, bit for bit; a set's folder plots as its run folders do; a set whose run folders are
gone plots from the series its comparison.json kept. Run folders written here (tests/bench/test_compare_like_with_like's
``fake_run``, fresh random values); the references are the values written, read back by loops."""

from __future__ import annotations

import gzip
import json
import shutil

import numpy as np
import pytest

from stapo.runs.archive import SERIES_KEYS, read_json, runs_from_comparison
from stapo.runs.compare import write_comparison
from stapo.runs.folder import group_runs, load_run
from stapo.runs.plot import main as plot
from tests.bench.test_compare_like_with_like import STEPS, fake_run


def test_read_json_reads_the_plain_file_or_else_its_gzipped_copy_bit_for_bit(tmp_path):
    rng = np.random.default_rng()
    document = {"values": [float(v) for v in rng.normal(size=200)] + [1e-300, 5e-324, -0.0, 1.7976931348623157e308],
                "text": "tau_p ≥ 0.002", "nested": {"n": int(rng.integers(1 << 40))}}
    plain = tmp_path / "comparison.json"
    plain.write_text(json.dumps(document), encoding="utf-8")
    assert read_json(plain) == document
    packed = tmp_path / "comparison.json.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes(), mtime=0))
    plain.unlink()
    again = read_json(plain)  # the name of the plain file: its gzipped copy is read
    assert again == document and [v.hex() for v in again["values"]] == [v.hex() for v in document["values"]]
    plain.write_text(json.dumps({"plain": True}), encoding="utf-8")
    assert read_json(plain) == {"plain": True}  # the plain file first, where both are
    with pytest.raises(FileNotFoundError, match=r"missing\.json: no such file, nor missing\.json\.gz beside it"):
        read_json(tmp_path / "missing.json")


def archived_set(root, rng) -> dict:
    """results/<set> as `stapo sweep --archive` leaves it: runs/<cell>/seed-<S>, and a checks/ run beside runs/."""
    written = {}
    for cell in ("algo=stapo", "algo=justrl"):
        for seed in (1, 2):
            written[(cell, seed)] = fake_run(root / "runs" / cell.replace("=", "-") / f"seed-{seed}", seed, cell,
                                             STEPS, rng)
    fake_run(root / "checks" / "stopped-at-step-5", 1, "algo=stapo", 5, rng)  # not one of the set's runs
    return written


def test_stapo_plot_of_a_sets_folder_draws_its_runs_and_not_its_checks(tmp_path, capsys):
    archived_set(tmp_path / "set", np.random.default_rng())
    runs = sorted(str(path) for path in (tmp_path / "set" / "runs").glob("*/seed-*"))
    assert plot([str(tmp_path / "set"), "--out", str(tmp_path / "a")]) == 0
    assert plot([*runs, "--out", str(tmp_path / "b")]) == 0
    by_set, by_runs = (json.loads((tmp_path / out / "comparison.json").read_text()) for out in ("a", "b"))
    assert by_set["run_dirs"] == by_runs["run_dirs"] == runs
    assert by_set["groups"] == by_runs["groups"]
    assert sorted(path.name for path in (tmp_path / "a").glob("*.png")) == ["entropy.png", "reward.png"]
    assert "[plot] wrote" in capsys.readouterr().out


def test_a_set_without_its_runs_plots_from_the_series_its_comparison_kept(tmp_path, capsys):
    written = archived_set(tmp_path / "set", np.random.default_rng())
    runs = [load_run(path) for path in sorted((tmp_path / "set" / "runs").glob("*/seed-*"))]
    write_comparison(group_runs(runs), tmp_path / "set", {})
    packed = tmp_path / "set" / "comparison.json.gz"  # as the archive keeps a large one
    packed.write_bytes(gzip.compress((tmp_path / "set" / "comparison.json").read_bytes(), mtime=0))
    (tmp_path / "set" / "comparison.json").unlink()
    shutil.rmtree(tmp_path / "set" / "runs")
    shutil.rmtree(tmp_path / "set" / "checks")

    groups = runs_from_comparison(tmp_path / "set")
    assert sorted(groups) == ["algo=justrl", "algo=stapo"]
    for name, members in groups.items():
        assert [run.seed for run in members] == [1, 2]
        for run in members:
            rows = written[(name, run.seed)]
            for key in {key for row in rows.values() for key in row}:  # every key written is a kept series
                assert key in SERIES_KEYS.values()
                expected = {step: row[key] for step, row in rows.items() if key in row}
                assert {step: values[key] for step, values in run.steps.items() if key in values} == expected, key

    assert plot([str(tmp_path / "set"), "--out", str(tmp_path / "p")]) == 0
    assert sorted(path.name for path in (tmp_path / "p").glob("*.png")) == ["entropy.png", "reward.png"]
    assert plot([str(tmp_path / "set"), "--per-run", "--out", str(tmp_path / "q")]) == 0
    assert (tmp_path / "q" / "reward.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        plot([str(tmp_path / "set"), str(tmp_path / "set"), "--out", str(tmp_path / "r")])
    assert exit_.value.code == 2 and "is drawn alone" in capsys.readouterr().err
