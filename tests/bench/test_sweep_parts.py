"""The sweep's grid, statistics, run-folder reading (metrics.jsonl and wandb offline) and grouped plots.

Fast: no trainer. Run folders are written the way verl's file logger writes them; the wandb run is
a real one, logged by the wandb package in offline mode (no network).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from stapo.algorithm.validation import STAPOConfigError
from stapo.rundir import ENTROPY_TOKEN_MEAN
from stapo.runs.compare import mean_se, summarize_group, summarize_run, write_comparison
from stapo.runs.folder import group_runs, load_run, load_run_config, name_and_seed, read_run_metrics
from stapo.runs.plot import group_series, plot_groups
from stapo.sweep.grid import PlannedRun, parse_axis, parse_seeds, plan, split_values
from stapo.wandb_offline import read_history, read_records, wandb_files


def write_metrics(run_dir: Path, rows: dict[int, dict[str, float]], record: dict | None = None) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"step": step, "data": data}) for step, data in rows.items()]
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    if record is not None:
        (run_dir / "sweep_run.json").write_text(json.dumps(record), encoding="utf-8")
    return run_dir


# --- grid ------------------------------------------------------------------------------------------


def test_values_split_at_top_level_commas_only():
    assert split_values("stapo,grpo") == ["stapo", "grpo"]
    assert split_values("[console,file],[console]") == ["[console,file]", "[console]"]
    assert split_values("'a,b',c") == ["'a,b'", "c"]


@pytest.mark.parametrize("text", ["algo", "algo=", "=a,b", "algo=a,,b", "algo=a,a"])
def test_bad_axis_names_the_problem(text):
    with pytest.raises(STAPOConfigError, match="--grid"):
        parse_axis(text)


@pytest.mark.parametrize("text", ["1,x", "1,1", "-1"])
def test_bad_seeds_are_refused(text):
    with pytest.raises(STAPOConfigError, match="--seeds"):
        parse_seeds(text)


def test_plan_is_the_product_of_axes_and_seeds(tmp_path):
    axes = [parse_axis("algo=stapo,grpo"), parse_axis("actor_rollout_ref.actor.policy_loss.tau_p=1e-3,2e-3")]
    runs = plan(axes, [1, 2, 3], tmp_path)
    assert len(runs) == 2 * 2 * 3
    assert len({run.run_dir for run in runs}) == len(runs)
    first = runs[0]
    assert first.cell == "algo=stapo,tau_p=1e-3" and first.seed == 1
    # seed by seed, every cell of a seed before the next seed: a partial sweep stays paired
    assert [run.seed for run in runs] == [1] * 4 + [2] * 4 + [3] * 4
    assert [run.cell for run in runs[:4]] == [run.cell for run in runs[4:8]]
    assert first.run_dir == (tmp_path / "runs" / "algo-stapo__tau_p-1e-3" / "seed-1").resolve()
    overrides = first.overrides(["model_preset=tiny", "algo=grpo"])
    # the grid and the seed come after the common overrides, so they win
    assert overrides.index("algo=stapo") > overrides.index("algo=grpo")
    assert "data.seed=1" in overrides and "actor_rollout_ref.rollout.seed=1" in overrides
    assert f"stapo.run_dir={first.run_dir}" in overrides and "trainer.resume_mode=auto" in overrides
    assert not any("=" in part or "," in part for part in first.run_dir.parts[-2:])  # a valid override value


def test_plan_refuses_seed_keys_and_twice_the_same_key(tmp_path):
    with pytest.raises(STAPOConfigError, match="--seeds"):
        plan([parse_axis("data.seed=1,2")], [1], tmp_path)
    with pytest.raises(STAPOConfigError, match="same key"):
        plan([parse_axis("algo=a,b"), parse_axis("+algo=c")], [1], tmp_path)


def test_ambiguous_leaf_names_keep_the_whole_key(tmp_path):
    runs = plan([parse_axis("a.x=1,2"), parse_axis("b.x=3")], [0], tmp_path)
    assert runs[0].cell == "a.x=1,b.x=3"
    assert isinstance(runs[0], PlannedRun) and plan([], [5], tmp_path)[0].cell == "base"


# --- statistics ------------------------------------------------------------------------------------


@pytest.mark.parametrize("values", [[0.1], [0.1, 0.4], [0.25, 0.5, 0.125, 1.0], [3.0, float("nan"), 5.0]])
def test_mean_se_matches_statistics(values):
    finite = [v for v in values if not np.isnan(v)]
    mean, se, n = mean_se(values)
    assert n == len(finite) and mean == pytest.approx(statistics.fmean(finite))
    if n < 2:
        assert se is None
    else:
        assert se == pytest.approx(statistics.stdev(finite) / np.sqrt(n))
    assert mean_se([]) == (None, None, 0)


def _two_seeds(tmp_path):
    a = write_metrics(
        tmp_path / "stapo-seed1",
        {
            1: {
                "val/average/acc": 0.2,
                "actor/entropy": 1.0,
                "actor/stapo/mask_ratio": 0.01,
                "actor/stapo/grad_bound_spurious": 0.5,
                "actor/stapo/grad_bound_positive": 1.0,
                "timing_s/step": 10.0,
                "critic/score/mean": -0.5,
            },
            2: {
                "val/average/acc": 0.6,
                "actor/entropy": 0.8,
                "actor/stapo/mask_ratio": 0.03,
                "actor/stapo/grad_bound_spurious": 0.0,
                "actor/stapo/grad_bound_positive": 3.0,
                "timing_s/step": 12.0,
                "critic/score/mean": 0.0,
            },
            3: {
                "val/average/acc": 0.4,
                "actor/entropy": 0.7,
                "actor/stapo/mask_ratio": 0.02,
                "timing_s/step": 11.0,
                "critic/score/mean": 0.5,
            },
        },
    )
    b = write_metrics(
        tmp_path / "stapo-seed2",
        {
            1: {
                "val-core/stapo/aime24/acc/mean@4": 0.1,
                "val-core/stapo/amc23/acc/mean@4": 0.3,
                "actor/entropy": 1.2,
                "actor/stapo/mask_ratio": 0.05,
                "timing_s/step": 9.0,
                "critic/score/mean": -0.25,
            },
            2: {
                "val-core/stapo/aime24/acc/mean@4": 0.5,
                "val-core/stapo/amc23/acc/mean@4": 0.7,
                "actor/entropy": 1.0,
                "actor/stapo/mask_ratio": 0.07,
                "timing_s/step": 9.0,
                "critic/score/mean": 0.25,
            },
        },
        record={"cell": "algo=stapo", "seed": 2, "seconds": 123.0},
    )
    return a, b


def test_group_summary_against_a_hand_computation(tmp_path):
    a, b = _two_seeds(tmp_path)
    runs = [load_run(a), load_run(b)]
    assert [r.group for r in runs] == ["stapo", "algo=stapo"]  # the sweep's record wins over the folder name
    summary = summarize_group("stapo", runs)
    stats = summary["stats"]
    # seed 1: last validated step 3 -> 0.4, best 0.6; seed 2: val-core average (0.5+0.7)/2 = 0.6, best 0.6
    assert stats["final_acc"]["mean"] == pytest.approx(0.5)
    assert stats["final_acc"]["se"] == pytest.approx(np.std([0.4, 0.6], ddof=1) / np.sqrt(2))
    assert stats["best_acc"]["mean"] == pytest.approx(0.6) and stats["best_acc"]["se"] == pytest.approx(0.0)
    assert stats["mask_ratio"]["mean"] == pytest.approx((0.02 + 0.06) / 2)
    # the grad share is logged by seed 1 only (steps 1 and 2), pooled over its steps: (0.5 + 0) / (1 + 3),
    # not the mean of the steps' shares (0.25); one run, so no standard error
    assert stats["grad_share"]["mean"] == pytest.approx(0.125) and stats["grad_share"]["se"] is None
    # every step is among the last 10: seed 1 (-0.5 + 0 + 0.5) / 3, seed 2 (-0.25 + 0.25) / 2
    assert stats["late_reward"]["mean"] == pytest.approx(0.0)
    assert summarize_run(runs[0], late_steps=2).values["late_reward"] == pytest.approx((0.0 + 0.5) / 2)
    assert summarize_run(runs[1], late_steps=1).values["late_reward"] == pytest.approx(0.25)
    assert stats["entropy_first"]["mean"] == pytest.approx(1.1) and stats["entropy_last"]["mean"] == pytest.approx(0.85)
    # wall time: the sweep's clock where recorded (123 s), else the sum of step times (33 s)
    assert stats["wall_s"]["mean"] == pytest.approx((33.0 + 123.0) / 2)
    trajectory = summary["entropy_trajectory"]
    assert trajectory["step"] == [1, 2, 3] and trajectory["n"] == [2, 2, 1]
    assert trajectory["mean"] == pytest.approx([1.1, 0.9, 0.7]) and trajectory["se"][2] is None


def test_comparison_files(tmp_path):
    a, b = _two_seeds(tmp_path)
    c = write_metrics(tmp_path / "grpo-seed1", {1: {"actor/entropy": 0.5, "timing_s/step": 5.0}})
    groups = group_runs([load_run(p) for p in (c, a, b)])
    both = {"stapo": groups["stapo"] + groups["algo=stapo"], "grpo": groups["grpo"]}
    # no config.yaml: compared at the last step any run reached (3), the two runs short of it listed
    document = write_comparison(both, tmp_path)
    table = (tmp_path / "comparison.md").read_text()
    assert "Every run compared at step 3 (the configured last step)" in table
    assert "| stapo | 1 | - | 0.400 | 0.600 |" in table and "| grpo |" not in table
    unfinished = [(r["group"], r["seed"], r["last_step"]) for r in document["unfinished"]]
    assert unfinished == [("stapo", 2, 2), ("grpo", 1, 1)]
    assert "- stapo seed 2: last step 2" in table and "- grpo seed 1: last step 1" in table
    assert json.loads((tmp_path / "comparison.json").read_text()) == json.loads(json.dumps(document))
    # at the last step all three reached (1): every run, every value of step 1, the step times up to it
    document = write_comparison(both, tmp_path, at_shared_step=True)
    table = (tmp_path / "comparison.md").read_text()
    assert "Every run compared at step 1 (the last step every run reached)" in table and not document["unfinished"]
    assert "| stapo | 1,2 | - | 0.200 ± 0.000 | 0.200 ± 0.000 | -0.375 ± 0.125 | 1.100 ± 0.100 -> 1.100 ± 0.100 |" \
        in table
    assert "| grpo | 1 | - | - | - | - | 0.500 -> 0.500 | - | - | 5 |" in table
    assert [run["wall_s"] for run in document["groups"][0]["runs"]] == [10.0, 9.0]



def test_entropy_not_aggregated_as_a_token_mean_is_flagged(tmp_path):
    """verl logs actor/entropy with the run's loss_agg_mode: a Dr.GRPO run's (seq-mean-token-sum-norm) is not
    a token mean, so its entropy cells, alone and paired, carry the mark and the note says why."""
    runs = []
    for name, mode in (("justrl", "token-mean"), ("drgrpo", "seq-mean-token-sum-norm"), ("grpo", None)):
        run_dir = write_metrics(tmp_path / f"{name}-seed1", {1: {"actor/entropy": 0.1, "val/average/acc": 0.5}},
                                record={"cell": name, "seed": 1})
        if mode is not None:  # grpo: a folder without config.yaml counts as token-mean
            (run_dir / "config.yaml").write_text(f"actor_rollout_ref:\n  actor:\n    loss_agg_mode: {mode}\n")
        runs.append(load_run(run_dir))
    document = write_comparison(group_runs(runs), tmp_path / "out", baseline="justrl")
    assert {g["group"]: g["entropy_agg"] for g in document["groups"]} == {
        "justrl": ["token-mean"], "drgrpo": ["seq-mean-token-sum-norm"], "grpo": ["None"]}
    paired = {g["group"]: g["entropy_token_mean"] for g in document["paired"]["groups"]}
    assert paired == {"drgrpo": False, "grpo": True}
    table = (tmp_path / "out" / "comparison.md").read_text()
    assert "| drgrpo | 1 | - | 0.500 | 0.500 | - | 0.100 -> 0.100 † |" in table
    assert "| justrl | 1 | - | 0.500 | 0.500 | - | 0.100 -> 0.100 |" in table
    assert "| drgrpo | 1 | 0.000 | 0.000 | - | 0.0000 † |" in table
    assert "| grpo | 1 | 0.000 | 0.000 | - | 0.0000 |" in table
    assert table.count("†: `actor/entropy` aggregated with this run's `loss_agg_mode`") == 2


def test_the_token_mean_entropy_is_read_first_whatever_the_loss_agg_mode(tmp_path):
    """A run that logged the driver's mean entropy of a response token is compared on it (Dr.GRPO's included:
    no mark); its actor/entropy, aggregated with the run's loss_agg_mode, is not read."""
    runs = []
    for name, mode, token_mean in (("justrl", "token-mean", 0.12), ("drgrpo", "seq-mean-token-sum-norm", 0.11)):
        steps = {1: {"actor/entropy": 0.05, ENTROPY_TOKEN_MEAN: token_mean, "val/average/acc": 0.5},
                 2: {"actor/entropy": 0.04, ENTROPY_TOKEN_MEAN: token_mean - 0.01}}
        run_dir = write_metrics(tmp_path / f"{name}-seed1", steps, record={"cell": name, "seed": 1})
        (run_dir / "config.yaml").write_text(f"actor_rollout_ref:\n  actor:\n    loss_agg_mode: {mode}\n")
        runs.append(load_run(run_dir))
    document = write_comparison(group_runs(runs), tmp_path / "out", baseline="justrl")
    groups = {g["group"]: g for g in document["groups"]}
    assert groups["drgrpo"]["entropy_token_mean"] and groups["drgrpo"]["stats"]["entropy_last"]["mean"] == 0.1
    assert groups["drgrpo"]["runs"][0]["entropy_trajectory"] == {"1": 0.11, "2": 0.1}
    assert document["paired"]["groups"][0]["diff"]["entropy_last"]["mean"] == pytest.approx(-0.01)
    table = (tmp_path / "out" / "comparison.md").read_text()
    assert "| drgrpo | 1 | - | 0.500 | 0.500 | - | 0.110 -> 0.100 |" in table and "†" not in table
    # a seed of the group without the token mean (a run from before it was logged): the group reads
    # actor/entropy for every seed, marked, rather than mixing two aggregations
    old = write_metrics(tmp_path / "drgrpo-seed2", {1: {"actor/entropy": 0.07}, 2: {"actor/entropy": 0.06}},
                        record={"cell": "drgrpo", "seed": 2})
    (old / "config.yaml").write_text((tmp_path / "drgrpo-seed1" / "config.yaml").read_text())
    mixed = write_comparison(group_runs(runs + [load_run(old)]), tmp_path / "mixed", baseline="justrl")
    drgrpo = next(g for g in mixed["groups"] if g["group"] == "drgrpo")
    assert not drgrpo["entropy_token_mean"]
    assert [r["entropy_trajectory"] for r in drgrpo["runs"]] == [{"1": 0.05, "2": 0.04}, {"1": 0.07, "2": 0.06}]
    assert "0.060 ± 0.010 -> 0.050 ± 0.010 †" in (tmp_path / "mixed" / "comparison.md").read_text()


def test_the_logged_threshold_grid_over_seeds(tmp_path):
    """Per run the mean over steps of each (tau_p, q) cell's would-be mask ratio, then mean ± SE over the
    runs: computed here with loops and numpy on random values; a run without the S2T mask gets no table."""
    rng = np.random.default_rng()
    tau_ps, qs = ("0.001", "0.002", "0.01"), ("0.5", "1")
    logged = {}  # seed -> step -> cell -> value
    runs = []
    for seed in (1, 2, 3):
        steps = {}
        for step in (1, 2, 3, 4):
            row = {"actor/stapo/mask_ratio": 1e-4, "actor/entropy": 1.0}
            for tau_p in tau_ps:
                for q in qs:
                    if seed == 3 and step == 4 and tau_p == "0.01":
                        continue  # a step that did not log a cell
                    value = float(rng.uniform(0, 1e-3))
                    row[f"actor/stapo/ablation/pos/tau_p={tau_p},q={q}/mask_ratio"] = value
                    row[f"actor/stapo/ablation/neg/tau_p={tau_p},q={q}/mask_ratio"] = 1.0  # never read
                    logged.setdefault(seed, {}).setdefault(step, {})[(tau_p, q)] = value
            steps[step] = row
        runs.append(load_run(write_metrics(tmp_path / f"stapo-seed{seed}", steps,
                                           record={"cell": "stapo", "seed": seed})))
    unmasked = {f"actor/stapo/ablation/pos/tau_p={t},q={q}/mask_ratio": 0.5 for t in tau_ps for q in qs}
    runs.append(load_run(write_metrics(tmp_path / "grpo-seed1", {step: {"actor/entropy": 1.0, **unmasked}
                                                                  for step in (1, 2, 3, 4)},
                                       record={"cell": "grpo", "seed": 1})))
    document = write_comparison(group_runs(runs), tmp_path / "out")
    stapo, grpo = document["groups"]
    assert "threshold_grid" not in grpo
    got = {(c["tau_p"], c["q"]): c for c in stapo["threshold_grid"]["cells"]}
    assert set(got) == {(t, q) for t in tau_ps for q in qs}
    for cell, stat in got.items():
        per_run = []
        for seed in (1, 2, 3):
            values = [logged[seed][step][cell] for step in logged[seed] if cell in logged[seed][step]]
            per_run.append(sum(values) / len(values))
        assert stat["mean"] == pytest.approx(np.mean(per_run))
        assert stat["se"] == pytest.approx(np.std(per_run, ddof=1) / np.sqrt(3))
    table = (tmp_path / "out" / "comparison.md").read_text()
    assert "would have silenced in `stapo`'s own rollouts (3 runs)" in table and "| tau_p \\ q | 0.5 | 1 |" in table
    first = got[("0.001", "0.5")]
    assert f"| 0.001 | {100 * first['mean']:.4f} ± {100 * first['se']:.4f} |" in table


def test_paired_differences_seed_by_seed(tmp_path):
    """The paired table takes each seed's difference to the baseline's run of that seed, then mean and
    SE over the seeds both ran: computed here seed by seed in a loop, against numpy's std."""
    rng = np.random.default_rng()
    acc = {name: {seed: float(rng.uniform(0.2, 0.6)) for seed in (1, 2, 3, 4)} for name in ("grpo", "stapo")}
    del acc["grpo"][4]  # a seed the baseline lacks is not paired
    runs = []
    for name, by_seed in acc.items():
        for seed, value in by_seed.items():
            steps = {1: {"val/average/acc": value, "actor/entropy": 1.0 + value, "timing_s/step": 2.0 + seed}}
            run_dir = write_metrics(tmp_path / f"{name}-seed{seed}", steps, record={"cell": name, "seed": seed})
            runs.append(load_run(run_dir))
    document = write_comparison(group_runs(runs), tmp_path / "out", baseline="grpo")
    (stapo,) = document["paired"]["groups"]
    deltas = [acc["stapo"][seed] - acc["grpo"][seed] for seed in (1, 2, 3)]
    assert stapo["group"] == "stapo" and stapo["seeds"] == [1, 2, 3]
    assert stapo["diff"]["final_acc"]["mean"] == pytest.approx(np.mean(deltas))
    assert stapo["diff"]["final_acc"]["se"] == pytest.approx(np.std(deltas, ddof=1) / np.sqrt(3))
    assert stapo["diff"]["entropy_last"]["mean"] == pytest.approx(np.mean(deltas))  # entropy = 1 + acc here
    assert stapo["diff"]["wall_s"] == {"mean": pytest.approx(0.0), "se": pytest.approx(0.0), "n": 3}
    table = (tmp_path / "out" / "comparison.md").read_text()
    assert "group minus `grpo`" in table and f"| stapo | 1,2,3 | {np.mean(deltas):.3f} ± " in table
    # the default baseline is the first group; a name that is not a group is refused by name
    assert write_comparison(group_runs(runs), tmp_path / "d")["paired"]["baseline"] == "grpo"
    with pytest.raises(ValueError, match="--baseline must be one of"):
        write_comparison(group_runs(runs), tmp_path / "e", baseline="algo=grpo")


def test_an_unknown_baseline_is_refused_before_any_run(tmp_path, capsys):
    from stapo.sweep.cli import main

    with pytest.raises(SystemExit):
        main(["--grid", "algo=stapo,grpo", "--out", str(tmp_path), "--baseline", "grpo", "--", "model_preset=tiny"])
    assert "--baseline must be one of the grid's cells ['algo=grpo', 'algo=stapo']" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_a_baseline_unlike_the_group_by_names_is_refused_before_any_run(tmp_path, capsys):
    from stapo.sweep.cli import main

    key = "actor_rollout_ref.actor.policy_loss.token_mask"
    with pytest.raises(SystemExit):
        main(["--grid", "algo=stapo,grpo", "--out", str(tmp_path), "--group-by", key, "--baseline", "algo=grpo"])
    assert "groups are named token_mask=<value>, so --baseline must be" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_a_baseline_no_group_has_keeps_the_runs_and_exits_non_zero(tmp_path, capsys):
    """With --group-by the group names are known only from the runs' configs: a value no run has is
    reported after them, the comparison is written without its paired table, the runs are kept."""
    from stapo.sweep.cli import main
    from stapo.sweep.grid import parse_axis, plan

    runs = plan([parse_axis("algo=stapo,grpo")], [1], tmp_path)
    for run in runs:
        write_metrics(run.run_dir, {1: {"val/average/acc": 0.5}}, record={"cell": run.cell, "seed": run.seed})
        mask = "stapo" if "stapo" in run.cell else "none"
        (run.run_dir / "config.yaml").write_text(
            f"actor_rollout_ref:\n  actor:\n    policy_loss:\n      token_mask: {mask}\n", encoding="utf-8"
        )
    argv = ["--grid", "algo=stapo,grpo", "--out", str(tmp_path), "--compare-only"]
    argv += ["--group-by", "actor_rollout_ref.actor.policy_loss.token_mask", "--baseline", "token_mask=entropy20"]
    assert main(argv) == 2
    out = capsys.readouterr().out
    assert "none of the compared groups ['token_mask=none', 'token_mask=stapo']" in out
    table = (tmp_path / "comparison.md").read_text()
    assert "| token_mask=stapo |" in table and "Paired by seed" not in table
    assert all(run.run_dir.is_dir() for run in runs)
    argv[-1] = "token_mask=none"
    assert main(argv) == 0 and "group minus `token_mask=none`" in (tmp_path / "comparison.md").read_text()

def test_names_and_seeds_of_folders():
    assert name_and_seed(Path("x/stapo-seed3")) == ("stapo", 3)
    assert name_and_seed(Path("runs/grpo/seed-2")) == ("grpo", 2)
    assert name_and_seed(Path("x/qwen3")) == ("qwen3", None)


# --- wandb offline ---------------------------------------------------------------------------------

WANDB_RUN = """
import wandb
run = wandb.init(project="bench", dir={dir!r}, config={{"algo": "stapo"}})
for step in range(1, 4):
    run.log({{"val/average/acc": 0.1 * step, "actor/entropy": 1.0 / step, "note": "text"}}, step=step)
run.log({{"actor/stapo/mask_ratio": 0.5}}, step=3)
run.finish()
"""


@pytest.fixture(scope="module")
def wandb_run_dir(tmp_path_factory):
    """A real wandb run in offline mode (what verl's wandb logger writes with WANDB_MODE=offline)."""
    root = tmp_path_factory.mktemp("wandb_run")
    env = dict(os.environ, WANDB_MODE="offline", WANDB_SILENT="true", WANDB_DISABLE_GIT="true")
    env.pop("WANDB_API_KEY", None)
    subprocess.run([sys.executable, "-c", WANDB_RUN.format(dir=str(root))], env=env, check=True, timeout=300)
    return root


def test_wandb_offline_history_is_read_without_network(wandb_run_dir):
    files = wandb_files(wandb_run_dir)
    assert len(files) == 1 and files[0].parent.name.startswith("offline-run-")
    history = read_history(wandb_run_dir)
    assert sorted(history) == [1, 2, 3]
    assert history[2]["val/average/acc"] == pytest.approx(0.2) and history[3]["actor/entropy"] == pytest.approx(1 / 3)
    assert history[3]["actor/stapo/mask_ratio"] == 0.5  # a second log at the same step merges
    assert "note" not in history[1] and not any(k.startswith("_") for k in history[1])
    kinds = [r.WhichOneof("record_type") for r in read_records(files[0])]
    assert kinds[0] == "header" and "exit" in kinds


def test_a_torn_wandb_log_keeps_the_records_before_the_tear(wandb_run_dir, tmp_path):
    data = wandb_files(wandb_run_dir)[0].read_bytes()
    torn = tmp_path / "run-torn.wandb"
    torn.write_bytes(data[: len(data) - 40])
    whole = list(read_records(wandb_files(wandb_run_dir)[0]))
    assert 0 < len(list(read_records(torn))) < len(whole)
    bad = tmp_path / "run-bad.wandb"
    bad.write_bytes(b"not a wandb log at all")
    with pytest.raises(ValueError, match="not a wandb run log"):
        list(read_records(bad))


def test_plot_reads_a_wandb_run_and_groups_with_seed_bands(wandb_run_dir, tmp_path):
    a, b = _two_seeds(tmp_path)
    out = tmp_path / "plots"
    written = plot_groups([a, b, wandb_run_dir], out)
    assert {p.name for p in written} >= {"reward.png", "entropy.png", "mask.png", "comparison.md"}
    groups = group_runs([load_run(p) for p in (a, b)])
    steps, means, ses = group_series(groups["stapo"] + groups["algo=stapo"], ("actor/entropy",))
    assert steps == [1, 2, 3] and means == pytest.approx([1.1, 0.9, 0.7]) and ses[0] == pytest.approx(0.1)
    grouped = group_runs([load_run(p, group_by="trainer.nonexistent") for p in (a, b)])
    assert set(grouped) == {"stapo"}  # an absent key falls back to the folder name


def test_stapo_plot_command(tmp_path):
    a, b = _two_seeds(tmp_path)
    from stapo.cli import main

    assert main(["plot", str(a), str(b), "--out", str(tmp_path / "p")]) == 0
    assert (tmp_path / "p" / "entropy.png").stat().st_size > 1000
    assert main(["plot", str(a), "--per-run", "--out", str(tmp_path / "q")]) == 0
    assert (tmp_path / "q" / "summary.md").exists()


# --- resumability and the command ------------------------------------------------------------------


def test_a_run_is_finished_by_its_record_or_by_reaching_the_last_step(tmp_path):
    from stapo.sweep.cli import is_finished

    assert not is_finished(tmp_path / "nothing")
    local = write_metrics(tmp_path / "local", {1: {"timing_s/step": 1.0}}, record={"returncode": 0})
    assert is_finished(local)
    failed = write_metrics(tmp_path / "failed", {1: {"timing_s/step": 1.0}}, record={"returncode": 1})
    assert not is_finished(failed)
    # a cluster job: no exit code here, finished when its metrics reach trainer.total_training_steps
    job = write_metrics(tmp_path / "job", {1: {"timing_s/step": 1.0}}, record={"job_id": "x"})
    (job / "config.yaml").write_text("trainer:\n  total_training_steps: 2\n")
    assert not is_finished(job)
    write_metrics(job, {1: {"timing_s/step": 1.0}, 2: {"timing_s/step": 1.0}}, record={"job_id": "x"})
    assert is_finished(job)


def test_dry_run_and_compare_only(tmp_path, capsys):
    from stapo.sweep.cli import main
    from stapo.sweep.grid import parse_axis, plan

    argv = [
        "--grid",
        "algo=stapo,grpo",
        "--seeds",
        "1,2",
        "--out",
        str(tmp_path),
        "--dry-run",
        "--",
        "model_preset=tiny",
    ]
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4 and all(line.startswith("[to run] python -m recipe.stapo.main_stapo") for line in lines)
    # finished run folders (as a cluster would leave them) are compared without running anything
    for run in plan([parse_axis("algo=stapo,grpo")], [1, 2], tmp_path):
        value = 0.5 if "stapo" in run.cell else 0.25
        write_metrics(
            run.run_dir,
            {2: {"val/average/acc": value + run.seed / 10, "timing_s/step": 3.0}},
            record={"cell": run.cell, "seed": run.seed, "returncode": 0, "seconds": 10.0},
        )
    assert main(["--grid", "algo=stapo,grpo", "--seeds", "1,2", "--out", str(tmp_path), "--compare-only"]) == 0
    table = (tmp_path / "comparison.md").read_text()
    assert "| algo=stapo | 1,2 | - | 0.650 ± 0.050 |" in table and "| algo=grpo | 1,2 | - | 0.400 ± 0.050 |" in table
    assert "(rows)" not in table  # one axis: no ablation layout


def test_an_archive_holds_only_finished_runs_small_and_a_sweep_on_it_compares_the_same_and_skips_them(
    tmp_path, capsys
):
    from stapo.sweep.cli import is_finished, main
    from stapo.sweep.grid import parse_axis, plan

    out, kept = tmp_path / "out", tmp_path / "kept"
    grid = ["--grid", "algo=stapo,grpo", "--seeds", "1,2"]
    runs = plan([parse_axis("algo=stapo,grpo")], [1, 2], out)
    for run in runs:
        finished = not (run.cell == "algo=grpo" and run.seed == 2)
        rows = {step: {"val/average/acc": 0.1 * step + run.seed, "timing_s/step": 3.0} for step in (1, 2)}
        record = {"cell": run.cell, "seed": run.seed, "returncode": 0 if finished else 1, "seconds": 10.0}
        write_metrics(run.run_dir, rows if finished else {1: rows[1]}, record)
        (run.run_dir / "config.yaml").write_text("trainer:\n  total_training_steps: 2\n")
        (run.run_dir / "checkpoints").mkdir()
        (run.run_dir / "trainer.log").write_text("log\n")
    assert main([*grid, "--out", str(out), "--compare-only", "--archive", str(kept)]) == 0
    assert "algo=grpo seed 2: not finished, not archived" in capsys.readouterr().out
    packed = {}
    for run in runs:
        copy = kept / run.run_dir.relative_to(out.resolve())
        if not is_finished(run.run_dir):
            assert not copy.exists()
            continue
        assert sorted(p.name for p in copy.iterdir()) == ["config.yaml.gz", "metrics.jsonl.gz", "sweep_run.json"]
        assert is_finished(copy) and read_run_metrics(copy) == read_run_metrics(run.run_dir)
        assert load_run_config(copy) == load_run_config(run.run_dir) is not None  # the config, gzipped, reads the same
        packed[copy] = (copy / "metrics.jsonl.gz").read_bytes()
    assert len(packed) == 3
    time.sleep(1.1)  # gzip's header holds seconds: a time stamp in it would now differ
    assert main([*grid, "--out", str(out), "--compare-only", "--archive", str(kept)]) == 0
    assert {copy: (copy / "metrics.jsonl.gz").read_bytes() for copy in packed} == packed  # same run, same bytes
    # the archive is a sweep folder: compared alone it gives the table of the finished runs
    assert main([*grid, "--out", str(kept), "--compare-only"]) == 0
    archived = json.loads((kept / "comparison.json").read_text())
    original = json.loads((out / "comparison.json").read_text())
    moved = json.dumps(archived["groups"]).replace(str(kept.resolve()), str(out.resolve()))
    assert json.loads(moved) == original["groups"]  # the same numbers; only the runs' folders differ
    # and a sweep over it runs only what it lacks
    capsys.readouterr()
    assert main([*grid, "--out", str(kept), "--dry-run", "--", "model_preset=tiny"]) == 0
    states = [line.split("]")[0] for line in capsys.readouterr().out.splitlines()]
    assert states == ["[done", "[done", "[done", "[to run"]


def test_a_two_axis_grid_is_laid_out_as_an_ablation_table(tmp_path):
    """tau_p down, q across, each cell the mean ± SE over seeds of that (tau_p, q): computed here cell by cell
    from the values written, with one cell left without runs ('-')."""
    from stapo.sweep.cli import main
    from stapo.sweep.grid import parse_axis, plan

    rng = np.random.default_rng()
    tau_p = "actor_rollout_ref.actor.policy_loss.tau_p=0.002,0.01"
    q = "actor_rollout_ref.actor.policy_loss.entropy_quantile=0.5,0.75,1.0"
    written: dict[str, list[float]] = {}
    for run in plan([parse_axis(tau_p), parse_axis(q)], [1, 2, 3], tmp_path):
        if run.cell == "tau_p=0.01,entropy_quantile=1.0":
            continue
        acc = float(rng.uniform(0.2, 0.6))
        written.setdefault(run.cell, []).append(acc)
        write_metrics(run.run_dir, {2: {"val/average/acc": acc, "actor/stapo/mask_ratio": acc / 100}},
                      record={"cell": run.cell, "seed": run.seed, "returncode": 0, "seconds": 10.0})
    assert main(["--grid", tau_p, "--grid", q, "--seeds", "1,2,3", "--out", str(tmp_path), "--compare-only"]) == 0
    table = (tmp_path / "comparison.md").read_text()
    section = table.split("final held-out acc: tau_p (rows) x entropy_quantile (columns)")[1].split("\n\n")[1]
    lines = section.splitlines()
    assert lines[0] == "| tau_p \\ entropy_quantile | 0.5 | 0.75 | 1.0 |"
    for line, tau in zip(lines[2:], ("0.002", "0.01"), strict=True):
        expected = []
        for value in ("0.5", "0.75", "1.0"):
            accs = written.get(f"tau_p={tau},entropy_quantile={value}")
            expected.append("-" if accs is None else f"{np.mean(accs):.3f} ± {np.std(accs, ddof=1) / np.sqrt(3):.3f}")
        assert line == f"| {tau} | " + " | ".join(expected) + " |"
    assert "mask ratio: tau_p (rows) x entropy_quantile (columns)" in table


@pytest.mark.parametrize(
    ("cell", "message"),
    [
        ("algo=stapo,stapoo", "sweep cell algo=stapoo seed 1: algo=stapoo"),
        ("actor_rollout_ref.actor.policy_loss.tau_p=0.002,1.5", "must be a probability in (0, 1)"),
    ],
)
def test_a_cell_the_recipe_refuses_is_refused_before_any_run_even_in_a_dry_run(tmp_path, capsys, cell, message):
    """Every cell goes through the recipe's own checks first: not '[to run]', not a failure when its turn comes."""
    from stapo.cli import main

    argv = ["sweep", "--grid", cell, "--seeds", "1", "--out", str(tmp_path), "--dry-run", "--", "model_preset=tiny"]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert "[to run]" not in captured.out
    (line,) = [line for line in captured.err.splitlines() if line.strip()]
    assert line.startswith("stapo") and message in line, line


@pytest.mark.parametrize(
    ("option", "value"), [("--max-parallel", "0"), ("--max-parallel", "two"), ("--poll", "0"), ("--poll", "x")]
)
def test_ray_options_outside_their_range_are_refused_by_name(tmp_path, capsys, option, value):
    from stapo.sweep.cli import main

    with pytest.raises(SystemExit):
        main(["--launcher", "ray", "--out", str(tmp_path), option, value])
    error = capsys.readouterr().err
    assert option in error and (">= 1" in error or "> 0" in error), error


@pytest.mark.parametrize(
    ("env", "token_file", "mode"),
    [
        ({}, True, "token"),  # ~/.ray/auth_token, as start_head.sh creates it
        ({}, False, None),  # no token anywhere: a cluster without authentication
        ({"RAY_AUTH_TOKEN": "abc"}, False, "token"),
        ({"RAY_AUTH_MODE": "disabled"}, True, "disabled"),  # the user's choice stays
    ],
)
def test_the_job_client_sends_the_token_where_submit_sh_would(tmp_path, monkeypatch, env, token_file, mode):
    from stapo.sweep.ray_launcher import enable_token_auth

    for key in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(key, raising=False)  # what enable_token_auth sets is undone by tests/conftest.py
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("HOME", str(tmp_path))
    if token_file:
        (tmp_path / ".ray").mkdir()
        (tmp_path / ".ray" / "auth_token").write_text("secret")
    enable_token_auth()
    assert os.environ.get("RAY_AUTH_MODE") == mode
