"""`stapo compare`: a sweep's comparison over run folders from several sets, and the comparison's account of what the
groups' settings differ in (stapo/runs/settings.py). Run folders written here (tests/bench/test_compare_like_with_like's
``fake_run``); the expected numbers recomputed from the values written, by loops; the settings' reference is a
hand-written list of the keys each test changed.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import numpy as np
import pytest

from stapo.cli import main as stapo
from stapo.runs.settings import ABSENT, MIXED, differences, read_settings
from tests.bench.test_compare_like_with_like import ACC, STEPS, TEST_FREQ, fake_run


def write_config(run_dir: Path, tau_p: float = 0.002, steps: int = STEPS, extra: str = "") -> None:
    """A config.yaml as the recipe resolves it, with the run's own folder in the keys a run derives from it."""
    (run_dir / "config.yaml").write_text(
        f"trainer:\n  total_training_steps: {steps}\n  test_freq: {TEST_FREQ}\n  experiment_name: x-{run_dir.name}\n"
        f"  default_local_dir: {run_dir}/checkpoints\n  resume_mode: auto\n"
        f"data:\n  seed: {run_dir.name[-1]}\n"
        f"stapo:\n  run_dir: {run_dir}\n"
        f"ray_kwargs:\n  env_vars:\n    WANDB_DIR: {run_dir}/wandb\n"
        f"actor_rollout_ref:\n  actor:\n    loss_agg_mode: token-mean\n    policy_loss:\n      tau_p: {tau_p}\n"
        f"{extra}", encoding="utf-8")


def two_sets(root: Path, rng) -> dict:
    """An ablation archive (cells tau_p=0.02 x seeds 1-3) and a centre set (algo=stapo, algo=justrl x seeds 1-3),
    laid out as `stapo sweep --archive` leaves them, with a checkpoint folder that is not a run."""
    written = {}
    for set_name, cells in (("ablation", {"tau_p=0.02": 0.02}), ("centre", {"algo=stapo": 0.002,
                                                                             "algo=justrl": 0.002})):
        for cell, tau_p in cells.items():
            for seed in (1, 2, 3):
                run_dir = root / set_name / "runs" / cell.replace("=", "-") / f"seed-{seed}"
                written[(cell, seed)] = fake_run(run_dir, seed, cell, STEPS, rng)
                write_config(run_dir, tau_p)
                (run_dir / "checkpoints" / "global_step_6").mkdir(parents=True)
    return written


def test_compare_pairs_runs_from_two_sets_by_seed_and_says_what_their_settings_differ_in(tmp_path, capsys):
    written = two_sets(tmp_path, np.random.default_rng())
    out = tmp_path / "cmp"
    argv = ["compare", str(tmp_path / "ablation" / "runs"), str(tmp_path / "centre" / "runs" / "algo-stapo"),
            str(tmp_path / "centre" / "runs" / "algo-justrl"), "--baseline", "algo=stapo", "--out", str(out)]
    assert stapo(argv) == 0
    console = capsys.readouterr()
    assert "[compare] 9 runs in 3 groups" in console.out and "warning" not in console.err
    document = json.loads((out / "comparison.json").read_text())
    assert len(document["compared_runs"]) == 9  # the checkpoint folders are not runs
    assert document["paired"]["baseline"] == "algo=stapo"
    paired = {group["group"]: group for group in document["paired"]["groups"]}
    assert sorted(paired) == ["algo=justrl", "tau_p=0.02"]
    for name in paired:
        deltas = [written[(name, seed)][STEPS][ACC] - written[("algo=stapo", seed)][STEPS][ACC] for seed in (1, 2, 3)]
        assert paired[name]["seeds"] == [1, 2, 3]
        assert paired[name]["diff"]["final_acc"]["mean"] == pytest.approx(statistics.fmean(deltas))
        assert paired[name]["diff"]["final_acc"]["se"] == pytest.approx(statistics.stdev(deltas) / math.sqrt(3))
    # the only setting that differs is the ablated one: seeds, run folders and log folders are left out
    ablated = {"actor_rollout_ref.actor.policy_loss.tau_p": [0.002, 0.02]}
    assert document["settings"] == {"against": "algo=stapo", "mixed": {},
                                    "differ": {"tau_p=0.02": ablated, "algo=justrl": {}}}
    table = (out / "comparison.md").read_text()
    assert "| tau_p=0.02 | `actor_rollout_ref.actor.policy_loss.tau_p` | 0.002 | 0.02 |" in table
    assert "| algo=justrl | (none) | | |" in table


def test_a_set_made_with_other_settings_shows_in_the_table_and_a_group_mixing_settings_is_warned_of(tmp_path, capsys):
    rng = np.random.default_rng()
    two_sets(tmp_path, rng)
    # the ablation was made with another test frequency and a key the centre's code did not have
    for run_dir in (tmp_path / "ablation" / "runs" / "tau_p-0.02").glob("seed-*"):
        write_config(run_dir, 0.02, extra="      new_key: 1\n")
    # one centre run made with another step count: its group mixes two settings
    write_config(tmp_path / "centre" / "runs" / "algo-justrl" / "seed-2", steps=STEPS, extra="    clip_ratio: 0.3\n")
    out = tmp_path / "cmp"
    assert stapo(["compare", str(tmp_path), "--baseline", "algo=stapo", "--out", str(out)]) == 0
    console = capsys.readouterr()
    document = json.loads((out / "comparison.json").read_text())
    assert document["settings"]["differ"]["tau_p=0.02"] == {
        "actor_rollout_ref.actor.policy_loss.new_key": [ABSENT, 1],
        "actor_rollout_ref.actor.policy_loss.tau_p": [0.002, 0.02]}
    assert document["settings"]["differ"]["algo=justrl"] == {"actor_rollout_ref.actor.clip_ratio": [ABSENT, MIXED]}
    assert document["settings"]["mixed"] == {"algo=justrl": ["actor_rollout_ref.actor.clip_ratio"]}
    warning = ("runs of one group differ in settings besides their seed: algo=justrl "
               "(actor_rollout_ref.actor.clip_ratio): a group's spread then mixes two settings")
    assert f"[compare] warning: {warning}" in console.err
    assert document["warnings"] == [warning] and f"**Warning**: {warning}" in (out / "comparison.md").read_text()


def test_compare_refuses_a_baseline_no_group_has_and_a_path_without_runs_with_one_line(tmp_path, capsys):
    two_sets(tmp_path, np.random.default_rng())
    with pytest.raises(SystemExit) as stop:
        stapo(["compare", str(tmp_path), "--baseline", "algo=grpo", "--out", str(tmp_path / "cmp")])
    assert stop.value.code == 2
    assert ("--baseline must be one of the groups the runs form ['algo=justrl', 'algo=stapo', 'tau_p=0.02'], got "
            "'algo=grpo'") in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    for path in (tmp_path / "empty", tmp_path / "missing"):
        with pytest.raises(SystemExit):
            stapo(["compare", str(path), "--out", str(tmp_path / "cmp")])
        assert str(path) in capsys.readouterr().err
    assert not (tmp_path / "cmp").exists()


def test_settings_differences_against_a_reference_by_hand():
    """differences() on configs written here: a key only one side has, a key the runs of a group disagree on, a
    value that is a list, a group without configs (left out)."""
    base = {"a.b": 1, "a.c": [1, 2], "d": "x"}
    found = differences({
        "base": [dict(base), dict(base)],
        "same": [dict(base)],
        "other": [{**base, "a.c": [1, 3], "e": 0.5}, {**base, "a.c": [1, 3], "e": 0.5}],
        "mixed": [dict(base), {**base, "d": "y"}],
        "none": [],
    }, "base")
    assert found == {
        "against": "base",
        "differ": {"same": {}, "other": {"a.c": [[1, 2], [1, 3]], "e": [ABSENT, 0.5]}, "mixed": {"d": ["x", MIXED]}},
        "mixed": {"mixed": ["d"]},
    }
    assert differences({"none": [], "b": [base]}, "none")["differ"] == {}  # no baseline configs: nothing to set beside


def test_read_settings_leaves_out_seeds_and_what_is_derived_from_the_run_folder(tmp_path):
    run_dir = tmp_path / "runs" / "algo-stapo" / "seed-3"
    run_dir.mkdir(parents=True)
    write_config(run_dir)
    assert read_settings(run_dir) == {"trainer.total_training_steps": STEPS, "trainer.test_freq": TEST_FREQ,
                                      "actor_rollout_ref.actor.loss_agg_mode": "token-mean",
                                      "actor_rollout_ref.actor.policy_loss.tau_p": 0.002}
    assert read_settings(tmp_path) is None


def test_group_by_a_key_no_config_has_is_refused_and_one_group_gets_no_settings_table(tmp_path, capsys):
    two_sets(tmp_path, np.random.default_rng())
    with pytest.raises(SystemExit) as stop:
        stapo(["compare", str(tmp_path), "--group-by", "actor_rollout_ref.actor.policy_loss.tau_q",
               "--out", str(tmp_path / "cmp")])
    assert stop.value.code == 2
    assert "--group-by actor_rollout_ref.actor.policy_loss.tau_q: no run's config.yaml has this key" in \
        capsys.readouterr().err
    # grouped by tau_p: the two centre groups (0.002) become one, the ablation (0.02) the other
    assert stapo(["compare", str(tmp_path / "centre"), "--group-by", "actor_rollout_ref.actor.policy_loss.tau_p",
                  "--out", str(tmp_path / "one")]) != 0  # two runs of each seed in one group: refused
    assert "holds two runs of seed" in capsys.readouterr().err
    assert stapo(["compare", str(tmp_path / "centre" / "runs" / "algo-stapo"), "--out", str(tmp_path / "one")]) == 0
    table = (tmp_path / "one" / "comparison.md").read_text()
    assert "Settings that differ" not in table and "Paired by seed" not in table


def test_runs_of_two_kinds_of_machine_are_compared_with_the_warning_first_on_stderr_and_in_the_files(tmp_path, capsys):
    """The same warning `stapo sweep` gives (tests/bench/test_compare_like_with_like), through the one helper."""
    two_sets(tmp_path, np.random.default_rng())
    kinds = {"centre": "AMD EPYC (AVX2)", "ablation": "Intel(R) Xeon(R) Processor (AMX)"}
    for folder, kind in kinds.items():
        path = tmp_path / folder
        for record_file in path.glob("runs/*/seed-*/sweep_run.json"):
            record = json.loads(record_file.read_text())
            record_file.write_text(json.dumps({**record, "machine": kind}), encoding="utf-8")
    assert stapo(["compare", str(tmp_path), "--baseline", "algo=stapo", "--out", str(tmp_path / "cmp")]) == 0
    warning = ("the compared runs were made on 2 kinds of machine (AMD EPYC (AVX2); Intel(R) Xeon(R) Processor (AMX)): "
               "runs of one seed are not paired bit for bit across kinds")
    assert f"[compare] warning: {warning}" in capsys.readouterr().err
    assert (tmp_path / "cmp" / "comparison.md").read_text().startswith(f"**Warning**: {warning}")


def test_compare_names_a_custom_rule_and_its_file_for_each_group(tmp_path, capsys):
    """A cell named ``algo=stapo`` may train with a user's rule: the comparison says which rule each group ran."""
    rng = np.random.default_rng(0)
    rule = "/abs/rules/my_rule.py"
    for cell, extra in (("algo=stapo", "      token_mask: stapo\n"),
                        ("mine", f"      token_mask: custom:my_rule\n  custom_rule:\n    path: {rule}\n")):
        for seed in (1, 2):
            run_dir = tmp_path / "runs" / cell.replace("=", "-") / f"seed-{seed}"
            fake_run(run_dir, seed, cell, STEPS, rng)
            write_config(run_dir, extra=extra)
            if cell == "mine":  # the custom rule's path sits under stapo:, the mask under policy_loss:
                text = (run_dir / "config.yaml").read_text().replace(f"  custom_rule:\n    path: {rule}\n", "")
                text = text.replace(f"stapo:\n  run_dir: {run_dir}\n",
                                    f"stapo:\n  run_dir: {run_dir}\n  custom_rule:\n    path: {rule}\n")
                (run_dir / "config.yaml").write_text(text)
    out = tmp_path / "cmp"
    assert stapo(["compare", str(tmp_path / "runs"), "--baseline", "algo=stapo", "--out", str(out)]) == 0
    capsys.readouterr()
    document = json.loads((out / "comparison.json").read_text())
    assert document["token_rules"] == {"algo=stapo": "stapo", "mine": f"custom:my_rule from {rule}"}
    assert f"mine: `custom:my_rule from {rule}`" in (out / "comparison.md").read_text()
