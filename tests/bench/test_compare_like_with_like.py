"""A comparison compares like with like, or says why it cannot: every case on run folders the test writes,
with the numbers recomputed here step by step from the values written (loops, not the module's code).

- a run short of its configured steps is left out and listed, never paired at another step;
- ``--at-shared-step`` compares every run at the last step they all reached;
- step 0 (the untrained model) is never the "best" held-out point;
- two runs of one seed in a group are refused, naming both folders (``stapo plot`` and ``stapo sweep``);
- ``stapo sweep --compare-only`` without ``--seeds`` compares the seeds that exist, and exits non-zero
  when it finds nothing to compare;
- a resumed run's wall time is the sum of its segments.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import numpy as np
import pytest

from stapo.runs.compare import ComparisonError, write_comparison
from stapo.runs.folder import earlier_segments, group_runs, load_run
from stapo.sweep.grid import parse_axis, plan

ACC = "val/average/acc"
REWARD = "critic/score/mean"
ENTROPY = "actor/stapo/entropy_token_mean"
STEPS = 24
TEST_FREQ = 6


def fake_run(run_dir: Path, seed: int, cell: str, last: int, rng, total: int = STEPS, seconds: float = 100.0) -> dict:
    """A run folder as a sweep leaves it, trained up to ``last`` of ``total`` configured steps, validated at
    step 0 and every TEST_FREQ steps (and at ``total``); returns the values written, step by step."""
    rows = {}
    for step in range(0, last + 1):
        row = {}
        if step % TEST_FREQ == 0 or step == total:
            row[ACC] = float(rng.uniform(0.2, 0.8))
        if step > 0:
            row.update({REWARD: float(rng.uniform(-1, 1)), ENTROPY: float(rng.uniform(0.1, 0.2)),
                        "timing_s/step": float(rng.uniform(2, 4))})
        rows[step] = row
    run_dir.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"step": step, "data": data}) for step, data in rows.items()]
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (run_dir / "config.yaml").write_text(
        f"trainer:\n  total_training_steps: {total}\n  test_freq: {TEST_FREQ}\n"
        "actor_rollout_ref:\n  actor:\n    loss_agg_mode: token-mean\n", encoding="utf-8")
    record = {"cell": cell, "seed": seed, "returncode": 0 if last >= total else 1, "seconds": seconds}
    (run_dir / "sweep_run.json").write_text(json.dumps(record), encoding="utf-8")
    return rows


def expected_values(rows: dict, at: int, held_out_steps: list[int]) -> dict:
    """The reference: one run's values at step ``at``, by loops over what was written."""
    acc_steps = [s for s in held_out_steps if s <= at]
    late = [rows[s][REWARD] for s in range(at - 9, at + 1) if s >= 1]
    return {
        "final_acc": rows[acc_steps[-1]][ACC],
        "best_acc": max(rows[s][ACC] for s in acc_steps if s > 0),
        "initial_acc": rows[0][ACC],
        "late_reward": sum(late) / len(late),
        "entropy_last": rows[at][ENTROPY],
    }


def mean_and_se(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), statistics.stdev(values) / math.sqrt(len(values))


@pytest.fixture
def sweep(tmp_path):
    """Two cells x 3 seeds of a 24-step sweep; ``algo=stapo`` seed 3 stopped at step 17 (validated last at 12)."""
    rng = np.random.default_rng()
    written = {}
    for run in plan([parse_axis("algo=justrl,stapo")], [1, 2, 3], tmp_path):
        last = 17 if (run.cell, run.seed) == ("algo=stapo", 3) else STEPS
        written[(run.cell, run.seed)] = (run.run_dir, fake_run(run.run_dir, run.seed, run.cell, last, rng))
    return tmp_path, written


def test_a_run_short_of_its_steps_is_left_out_and_listed_not_paired_at_another_step(sweep):
    out, written = sweep
    runs = [load_run(path) for path, _ in written.values()]
    document = write_comparison(group_runs(runs), out / "cmp", baseline="algo=justrl")
    assert document["compared_at"] == STEPS and document["held_out_at"] == STEPS
    assert document["best_steps"] == [6, 12, 18, 24]  # step 0 is not among them
    assert document["unfinished"] == [{"group": "algo=stapo", "seed": 3, "last_step": 17,
                                       "run_dir": str(written[("algo=stapo", 3)][0])}]
    groups = {g["group"]: g for g in document["groups"]}
    assert groups["algo=stapo"]["seeds"] == [1, 2] and groups["algo=justrl"]["seeds"] == [1, 2, 3]
    reference = {key: expected_values(rows, STEPS, [0, 6, 12, 18, 24]) for key, (_, rows) in written.items()
                 if key != ("algo=stapo", 3)}
    for name, group in groups.items():
        for quantity in ("final_acc", "best_acc", "initial_acc", "late_reward", "entropy_last"):
            values = [reference[(name, seed)][quantity] for seed in group["seeds"]]
            mean, se = mean_and_se(values)
            assert group["stats"][quantity]["mean"] == pytest.approx(mean), quantity
            assert group["stats"][quantity]["se"] == pytest.approx(se), quantity
        # every kept series stops at the compared step, and holds every validation
        for run in group["runs"]:
            assert run["compared_at"] == STEPS and max(map(int, run["series"]["reward"])) == STEPS
            assert sorted(map(int, run["series"]["held_out_acc"])) == [0, 6, 12, 18, 24]
    (paired,) = document["paired"]["groups"]
    assert paired["seeds"] == [1, 2]  # seed 3 of stapo is not set against seed 3 of justrl at another step
    for quantity in ("final_acc", "best_acc", "late_reward", "entropy_last"):
        deltas = [reference[("algo=stapo", s)][quantity] - reference[("algo=justrl", s)][quantity] for s in (1, 2)]
        assert paired["diff"][quantity]["mean"] == pytest.approx(sum(deltas) / 2)
        assert paired["diff"][quantity]["se"] == pytest.approx(statistics.stdev(deltas) / math.sqrt(2))
    table = (out / "cmp" / "comparison.md").read_text(encoding="utf-8")
    assert "Every run compared at step 24 (the configured last step)" in table
    assert "**Left out, short of step 24** (1 run(s)" in table and "- algo=stapo seed 3: last step 17" in table


def test_at_the_shared_step_every_run_is_read_at_the_last_step_all_reached(sweep):
    out, written = sweep
    runs = [load_run(path) for path, _ in written.values()]
    document = write_comparison(group_runs(runs), out / "cmp", at_shared_step=True)
    assert document["compared_at"] == 17 and not document["unfinished"]
    assert document["held_out_at"] == 12 and document["best_steps"] == [6, 12]
    (paired,) = document["paired"]["groups"]
    assert paired["seeds"] == [1, 2, 3]
    reference = {key: expected_values(rows, 17, [0, 6, 12]) for key, (_, rows) in written.items()}
    for quantity in ("final_acc", "best_acc", "late_reward", "entropy_last"):
        deltas = [reference[("algo=stapo", s)][quantity] - reference[("algo=justrl", s)][quantity] for s in (1, 2, 3)]
        assert paired["diff"][quantity]["mean"] == pytest.approx(statistics.fmean(deltas)), quantity
    # wall time at step 17: the logged step times up to it for every run (the sweep's clock covers the whole run)
    for group in document["groups"]:
        for run in group["runs"]:
            rows = written[(group["group"], run["seed"])][1]
            assert run["wall_s"] == pytest.approx(sum(rows[s]["timing_s/step"] for s in range(1, 18)))
    table = (out / "cmp" / "comparison.md").read_text()
    assert "Every run compared at step 17 (the last step every run reached)" in table


def test_step_0_is_never_the_best_held_out_point(tmp_path):
    """The untrained model validated before training scores higher than every trained step: "best" is the best
    trained step, and the untrained model's score is its own column."""
    rng = np.random.default_rng()
    rows = fake_run(tmp_path / "a" / "seed-1", 1, "a", STEPS, rng)
    rows[0][ACC] = 0.99
    lines = [json.dumps({"step": step, "data": data}) for step, data in rows.items()]
    (tmp_path / "a" / "seed-1" / "metrics.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    document = write_comparison(group_runs([load_run(tmp_path / "a" / "seed-1")]), tmp_path / "cmp")
    stats = document["groups"][0]["stats"]
    assert stats["initial_acc"]["mean"] == 0.99
    assert stats["best_acc"]["mean"] == max(rows[s][ACC] for s in (6, 12, 18, 24)) < 0.99


def test_a_duplicate_seed_in_a_group_is_refused_naming_both_folders(tmp_path, capsys):
    rng = np.random.default_rng()
    first, second = tmp_path / "stapo-seed1", tmp_path / "x" / "stapo-seed1"
    fake_run(first, 1, "stapo", STEPS, rng)
    fake_run(second, 1, "stapo", STEPS, rng)
    with pytest.raises(ComparisonError, match="two runs of seed 1") as refused:
        write_comparison(group_runs([load_run(first), load_run(second)]), tmp_path / "cmp")
    assert str(first) in str(refused.value) and str(second) in str(refused.value)
    assert not (tmp_path / "cmp").exists()
    from stapo.runs.plot import main as plot_main

    assert plot_main([str(first), str(second), "--out", str(tmp_path / "plots")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "two runs of seed 1" in err and str(second) in err
    assert not list((tmp_path / "plots").glob("*.png")) if (tmp_path / "plots").exists() else True


def test_a_duplicate_seed_formed_by_group_by_fails_the_sweep_comparison(tmp_path, capsys):
    """A two-axis grid grouped by one key puts two runs of each seed in a group: refused, exit code 2."""
    from stapo.sweep.cli import main

    rng = np.random.default_rng()
    axes = ["algo=justrl,stapo", "actor_rollout_ref.actor.optim.lr=1e-5,2e-5"]
    for run in plan([parse_axis(a) for a in axes], [1], tmp_path):
        fake_run(run.run_dir, run.seed, run.cell, STEPS, rng)
        config = run.run_dir / "config.yaml"
        config.write_text(config.read_text() + f"algorithm:\n  name: {run.cell.split(',')[0].split('=')[1]}\n")
    argv = ["--grid", axes[0], "--grid", axes[1], "--seeds", "1", "--out", str(tmp_path), "--compare-only",
            "--group-by", "algorithm.name"]
    assert main(argv) == 2
    out = capsys.readouterr().out
    assert "[sweep] error: group 'name=justrl' holds two runs of seed 1" in out
    assert not (tmp_path / "comparison.md").exists()


def test_compare_only_finds_the_seeds_that_exist_and_refuses_an_empty_out(tmp_path, capsys):
    from stapo.sweep.cli import main

    rng = np.random.default_rng()
    for run in plan([parse_axis("algo=justrl,stapo")], [1, 2, 5], tmp_path):
        fake_run(run.run_dir, run.seed, run.cell, STEPS, rng)
    assert main(["--grid", "algo=justrl,stapo", "--out", str(tmp_path), "--compare-only"]) == 0
    document = json.loads((tmp_path / "comparison.json").read_text())
    assert [g["seeds"] for g in document["groups"]] == [[1, 2, 5], [1, 2, 5]]
    assert document["paired"]["groups"][0]["seeds"] == [1, 2, 5]
    capsys.readouterr()
    # a mistyped --out: nothing found, nothing written, a non-zero exit
    assert main(["--grid", "algo=justrl,stapo", "--out", str(tmp_path / "typo"), "--compare-only"]) == 2
    assert "no run folder of the grid's cells" in capsys.readouterr().out
    assert not (tmp_path / "typo").exists()
    # seeds asked for that have no run folder: nothing compared, a non-zero exit
    assert main(["--grid", "algo=justrl,stapo", "--seeds", "7", "--out", str(tmp_path), "--compare-only"]) == 2
    assert "has metrics: nothing compared" in capsys.readouterr().out


def test_a_resumed_runs_wall_time_is_the_sum_of_its_segments(tmp_path):
    rng = np.random.default_rng()
    run_dir = tmp_path / "a" / "seed-1"
    fake_run(run_dir, 1, "a", 12, rng, seconds=40.0)  # a first segment, stopped at step 12
    assert earlier_segments(run_dir) == [40.0]
    fake_run(run_dir, 1, "a", STEPS, rng)  # then resumed to the end
    record = json.loads((run_dir / "sweep_run.json").read_text())
    # what the sweep's record held before (the last segment's 60 s alone) is not what the comparison reads
    record.update(seconds=60.0, segments_s=[40.0, 60.0])
    (run_dir / "sweep_run.json").write_text(json.dumps(record))
    assert earlier_segments(run_dir) == [40.0, 60.0]
    document = write_comparison(group_runs([load_run(run_dir)]), tmp_path / "cmp")
    assert document["groups"][0]["runs"][0]["wall_s"] == 100.0
    # a folder without metrics starts afresh: an old record's time is not carried over
    (run_dir / "metrics.jsonl").unlink()
    assert earlier_segments(run_dir) == []


def test_runs_made_on_two_kinds_of_machine_are_compared_with_a_warning_in_the_console_and_the_files(tmp_path, capsys):
    """The sweep record keeps the machine's kind (stapo/runs/machine.py); a comparison over runs of several kinds says
    so (they are not paired bit for bit); records from before the field, or of one kind, say nothing."""
    from stapo.sweep.cli import main

    rng = np.random.default_rng()
    runs = plan([parse_axis("algo=justrl,stapo")], [1, 2], tmp_path)
    for run in runs:
        fake_run(run.run_dir, run.seed, run.cell, STEPS, rng)
    argv = ["--grid", "algo=justrl,stapo", "--seeds", "1,2", "--out", str(tmp_path), "--compare-only"]
    assert main(argv) == 0
    assert "kinds of machine" not in capsys.readouterr().out + (tmp_path / "comparison.md").read_text()
    for run, kind in zip(runs, ["AMD EPYC (AVX2)", "AMD EPYC (AVX2)", "Intel(R) Xeon(R) Processor (AMX)", None]):
        record = json.loads((run.run_dir / "sweep_run.json").read_text())
        (run.run_dir / "sweep_run.json").write_text(json.dumps({**record, "machine": kind}), encoding="utf-8")
    assert main(argv) == 0
    warning = ("the compared runs were made on 2 kinds of machine (AMD EPYC (AVX2); Intel(R) Xeon(R) Processor (AMX)): "
               "runs of one seed are not paired bit for bit across kinds")
    assert f"[sweep] warning: {warning}" in capsys.readouterr().out
    assert (tmp_path / "comparison.md").read_text().startswith(f"**Warning**: {warning}")
    assert json.loads((tmp_path / "comparison.json").read_text())["warnings"][0].startswith(warning)
    # one kind of machine, but the model of one run built on another (a cache shared between kinds)
    for run, built in zip(runs, ["AMD EPYC (AVX2)", "AMD EPYC (AVX2)", "Intel(R) Xeon(R) Processor (AMX)", None]):
        record = json.loads((run.run_dir / "sweep_run.json").read_text())
        record.update(machine="AMD EPYC (AVX2)", model_built_on=built)
        (run.run_dir / "sweep_run.json").write_text(json.dumps(record), encoding="utf-8")
    assert main(argv) == 0
    warning = ("the compared runs' models were built on 2 kinds of machine (AMD EPYC (AVX2); Intel(R) Xeon(R) "
               "Processor (AMX)): runs of one seed are not paired bit for bit across kinds")
    assert f"[sweep] warning: {warning}" in capsys.readouterr().out
    assert (tmp_path / "comparison.md").read_text().startswith(f"**Warning**: {warning}")
