"""The testbed timing scripts of the testbed step profile (docs/benchmarks-history.md, "the history" below):
the console-log reader against values it was given (random, on a written log), and the other scripts' command lines."""

from __future__ import annotations

import hashlib
import json
import os
import random
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.testbed_timings import PHASES, parse, summary
from stapo.runs.archive import read_json

REPO = Path(__file__).resolve().parents[2]
# the dated entries the tests below recompute; BENCHMARKS.md keeps the current figures (its generated sections)
HISTORY = REPO / "docs" / "benchmarks-history.md"
BENCHMARKS = REPO / "BENCHMARKS.md"


def written_log(rng: random.Random, steps: int = 12) -> tuple[str, dict]:
    lines, truth = ["(TaskRunnerV1 pid=1) some start-up line"], {}
    for step in range(1, steps + 1):
        timings = {phase: round(rng.uniform(0.01, 5.0), 6) for phase in PHASES}
        metrics = " - ".join(f"timing_s/{k}:{v}" for k, v in timings.items())
        if step % 5 == 0:
            timings["testing"] = round(rng.uniform(10, 60), 6)
            acc = round(rng.random(), 6)
            metrics += f" - timing_s/testing:{timings['testing']}"
            metrics += f" - val-core/stapo/addition/acc/mean@8:np.float64({acc})"
        lines.append(f"(TaskRunnerV1 pid=1) step:{step} - actor/entropy:0.1 - {metrics} - perf/x:1")
        truth[step] = timings
    lines.append("run rc 0 wall 321.5")
    return "\n".join(lines) + "\n", truth


def test_the_log_reader_returns_what_the_log_says_and_its_medians(tmp_path):
    rng = random.Random()
    text, truth = written_log(rng)
    run = parse(text)
    assert run["rc"] == 0 and run["wall_s"] == 321.5
    assert {s: v["timing_s"] for s, v in run["steps"].items()} == truth
    out = summary(run)
    for phase in PHASES:
        assert out["median_s"][phase] == statistics.median(truth[s][phase] for s in truth if s >= 2)
    assert out["testing_s"] == {s: v["testing"] for s, v in truth.items() if "testing" in v}
    in_steps = sum(v["step"] + v.get("testing", 0.0) for v in truth.values())
    assert abs(out["outside_steps_s"] - (321.5 - in_steps)) < 1e-9
    log = tmp_path / "submission" / "run.log"
    log.parent.mkdir()
    log.write_text(text)
    target = tmp_path / "out.json"
    done = subprocess.run([sys.executable, "-m", "benchmarks.testbed_timings", str(log), "--json", str(target)],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("submission ") and set(json.loads(target.read_text())) == {"submission"}


def test_the_recorded_timings_are_what_benchmarks_md_quotes():
    runs = read_json(REPO / "benchmarks" / "testbed_runs" / "2026-11-26-submission-batch.json")
    group, submission = summary(runs["group"]), summary(runs["submission"])
    assert f"{group['median_s']['step']:.2f}" == "6.32" and f"{submission['median_s']['step']:.2f}" == "4.10"
    assert [f"{v:.1f}" for v in submission["testing_s"].values()] == ["26.7", "27.2"]
    text = HISTORY.read_text()
    assert "| `step` | 6.32 (3.7x the model's 1.70) | 4.10 (2.4x) |" in text


def test_the_other_scripts_command_lines():
    for module in ("benchmarks.testbed_model_work", "benchmarks.profile_mask", "benchmarks.startup"):
        done = subprocess.run([sys.executable, "-m", module, "--help"], cwd=REPO, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0 and "usage:" in done.stdout, (module, done.stderr[-500:])



@pytest.mark.parametrize("seed", range(5))
def test_the_row_token_quantiles_are_nearest_rank(seed):
    """Each named quantile q of the rows' token counts is a value v with fewer than q*n rows below it and more than
    q*n at or below it (the nearest-rank rule, ties included); min and max are the extremes."""
    from benchmarks.testbed_model_work import row_token_quantiles

    rng = random.Random(seed)
    lengths = [rng.choice([1, 64, rng.randint(20, 64)]) for _ in range(rng.randint(1, 600))]
    found = row_token_quantiles(lengths)
    assert (found["min"], found["max"]) == (min(lengths), max(lengths))
    for name, q in {"q25": 0.25, "median": 0.5, "q75": 0.75, "q95": 0.95}.items():
        v, n = found[name], len(lengths)
        assert sum(x < v for x in lengths) <= q * n < sum(x <= v for x in lengths), (name, v)

def test_the_in_place_cache_timings_are_what_benchmarks_md_quotes():
    """The history's table of the in-place KV cache, recomputed from the two runs' logs and the model work."""
    folder = REPO / "benchmarks" / "testbed_runs"
    runs = read_json(folder / "2026-11-26-preallocated-cache.json")
    work = read_json(folder / "2026-11-26-preallocated-cache-model-work.json")
    before, after = summary(runs["dynamic-cache"]), summary(runs["preallocated-cache"])
    rows = {
        "model work: a step's 8 x 8 samples decoded as one batch": [f"{w['decode_step_s']:.2f}" for w in work.values()],
        "model work: the validation's 64 x 8 decoded as one batch":
            [f"{w['decode_validation_s']:.2f}" for w in work.values()],
        "model work: forward + backward + GainAdamW": [f"{w['update_s']:.2f}" for w in work.values()],
        **{f"trainer: `{phase}`, median of steps 2-20": [f"{run['median_s'][phase]:.2f}" for run in (before, after)]
           for phase in ("gen", "step")},
        "trainer: `testing` at steps 10, 20": [", ".join(f"{v:.1f}" for v in run["testing_s"].values())
                                               for run in (before, after)],
        "trainer: 20 steps, command to exit": [f"{run['wall_s']:.0f}" for run in (before, after)],
    }
    assert list(work) == ["dynamic-cache", "preallocated-cache"]
    text = HISTORY.read_text()
    for title, (old, new) in rows.items():
        assert f"| {title} | {old} | {new} |" in text, title


TRAINER_PHASES = ("gen", "old_log_prob", "update_actor", "step")


def assert_trainer_rows(text: str, table: list[dict], testing_steps: str) -> None:
    """The rows the history's A/B tables of 20-step testbed runs share, one column a run (``summary``'s answer):
    each phase's median, the validations' times (at ``testing_steps``) and the command-to-exit time."""
    for phase in TRAINER_PHASES:
        cells = " | ".join(f"{run['median_s'][phase]:.2f}" for run in table)
        assert f"| trainer: `{phase}`, median of steps 2-20 | {cells} |" in text, phase
    cells = " | ".join(", ".join(f"{v:.1f}" for v in run["testing_s"].values()) for run in table)
    assert f"| trainer: `testing` at steps {testing_steps} | {cells} |" in text
    assert "| trainer: 20 steps, command to exit | " + " | ".join(f"{r['wall_s']:.0f}" for r in table) + " |" in text


def test_the_batched_log_prob_timings_are_what_benchmarks_md_quotes():
    """The history's table of the batched log-probs, and the ratios under it, recomputed from the runs' logs and
    the model work."""
    folder = REPO / "benchmarks" / "testbed_runs"
    runs = read_json(folder / "2026-11-26-batched-logprobs.json")
    work = read_json(folder / "2026-11-26-batched-logprobs-model-work.json")["batched-logsumexp"]
    before, after = summary(runs["row-logsumexp"]), summary(runs["batched-logsumexp"])
    text = HISTORY.read_text()
    assert_trainer_rows(text, [before, after], "10, 20")
    flat = " ".join(text.split())
    assert (f"decoded as one batch {work['decode_step_s']:.2f} s, forward + backward + GainAdamW "
            f"{work['update_s']:.2f} s, so {work['step_model_work_s']:.2f} s a step; the validation's 64 x 8 decoded "
            f"{work['decode_validation_s']:.2f} s") in flat
    step = work["step_model_work_s"]
    now, was = after["median_s"]["step"], before["median_s"]["step"]
    assert f"The step is now {now / step:.1f}x its model work ({now:.2f} s; {was / step:.1f}x before)" in flat
    validation = sorted(v / work["decode_validation_s"] for v in after["testing_s"].values())
    assert f"a validation {validation[0]:.1f}-{validation[-1]:.1f}x its decode" in flat
    assert f"({after['median_s']['update_actor']:.2f} against {work['update_s']:.2f} s)" in flat


def test_the_batched_log_prob_runs_logged_the_same_numbers():
    """The history says every metric of the two runs is identical at all 20 steps: the logged values, as printed."""
    runs = read_json(REPO / "benchmarks" / "testbed_runs" / "2026-11-26-batched-logprobs-metrics.json")
    before, after = runs["runs"]["row-logsumexp"], runs["runs"]["batched-logsumexp"]
    count = sum(len(metrics) for metrics in before.values())
    assert sorted(before, key=int) == [str(step) for step in range(1, 21)] and before == after
    assert f"({count:,} logged values other than timings" in " ".join(HISTORY.read_text().split())
    assert before["20"]["val-core/stapo/addition/acc/mean@8"].startswith("0.3457")



SHARED_ORDER = ("per-request-first", "shared-second", "shared-first", "per-request-second")


def test_the_shared_loop_timings_are_what_benchmarks_md_quotes():
    """The history's table of the agent loops built once per worker (two pairs of runs in opposite orders), and the
    ratios under it, recomputed from the four runs' logs and the model work after each pair."""
    folder = REPO / "benchmarks" / "testbed_runs"
    runs = read_json(folder / "2026-11-27-shared-loops.json")
    work = read_json(folder / "2026-11-27-shared-loops-model-work.json")["after-second-pair"]
    found = {name: summary(runs[name]) for name in SHARED_ORDER}
    table = [found[name] for name in SHARED_ORDER]
    text = HISTORY.read_text()
    assert_trainer_rows(text, table, "10, 20")
    assert "| trainer: of it outside the steps and validations | " + " | ".join(
        f"{r['outside_steps_s']:.0f}" for r in table) + " |" in text
    flat = " ".join(text.split())
    assert (f"decoded as one batch {work['decode_step_s']:.2f} s, forward + backward + GainAdamW "
            f"{work['update_s']:.2f} s, so {work['step_model_work_s']:.2f} s a step; the validation's 64 x 8 decoded "
            f"{work['decode_validation_s']:.2f} s") in flat

    def testing(prefix: str) -> list[float]:
        return sorted(v for name in SHARED_ORDER if name.startswith(prefix) for v in found[name]["testing_s"].values())

    shared, per_request = testing("shared"), testing("per-request")
    assert f"{shared[0]:.1f}-{shared[-1]:.1f} s against {per_request[0]:.1f}-{per_request[-1]:.1f} s" in flat
    later = {name: found[name]["testing_s"].values() for name in ("shared-first", "per-request-second")}
    ratio = {name: sorted(v / work["decode_validation_s"] for v in values) for name, values in later.items()}
    assert (f"{ratio['shared-first'][0]:.1f}-{ratio['shared-first'][-1]:.1f}x its decode on the shared loops "
            f"({ratio['per-request-second'][0]:.1f}-{ratio['per-request-second'][-1]:.1f}x on verl's manager)") in flat
    step = {name: found[name]["median_s"] for name in SHARED_ORDER}
    first_gap = step["per-request-first"]["step"] - step["shared-second"]["step"]
    second_gap = step["per-request-second"]["gen"] - step["shared-first"]["gen"]
    assert f"the first pair's {first_gap:.2f} s is the order" in flat
    assert f"the shared loops' `gen` is {second_gap:.2f} s shorter" in flat
    ratios = {f"{step[n]['step'] / work['step_model_work_s']:.1f}" for n in ("shared-first", "per-request-second")}
    assert ratios == {"2.3"} and "the step 2.3x its model work either way" in flat


def test_the_shared_loop_runs_logged_the_same_numbers():
    """The history says every value the four runs logged, timings, throughput and memory aside, is the same at all
    20 steps."""
    runs = read_json(REPO / "benchmarks" / "testbed_runs" / "2026-11-27-shared-loops-metrics.json")
    first, *others = (runs["runs"][name] for name in SHARED_ORDER)
    count = sum(len(metrics) for metrics in first.values())
    assert sorted(first, key=int) == [str(step) for step in range(1, 21)] and all(run == first for run in others)
    assert f"({count:,} logged values other than timings" in " ".join(HISTORY.read_text().split())


def test_the_start_up_and_suite_figures_are_what_benchmarks_md_quotes():
    """The history's start-up table (vLLM kept against hidden) and the suite before and after, recomputed from
    the recorded files; the two runs logged the same values."""
    from benchmarks.startup import summary as startup_summary

    recorded = read_json(REPO / "benchmarks" / "startup_runs" / "2026-11-27-hide-vllm.json")
    found = startup_summary(recorded["runs"])
    assert found == recorded["summary"] and found["identical_logged_values"]
    flat = " ".join(HISTORY.read_text().split())
    kept, hidden = found["kept"], found["hidden"]
    assert (f"| command to verl's first step line, s | {kept['first_step_s'][0]} | {hidden['first_step_s'][0]} |"
            in flat)
    assert f"| command to exit, s | {kept['wall_s'][0]} | {hidden['wall_s'][0]} |" in flat
    assert f"the {found['logged_values_a_run']} values each run logged" in flat
    suite = read_json(REPO / "benchmarks" / "suite_runs" / "2026-11-27-hide-vllm.json")
    before, after = suite["before-867dd43"], suite["after-4b8131d"]
    assert before["failures"] == after["failures"] == 0
    assert (f"{before['wall_s']:,.0f} s at 867dd43 ({before['worker_s']:,.0f} s of worker time) and "
            f"{after['wall_s']:,.0f} s at 4b8131d ({after['worker_s']:,.0f} s)") in flat
    readme = " ".join((REPO / "docs" / "testing.md").read_text().split())
    assert (f"pytest {before['wall_s']:,.0f} s at 867dd43, then {after['wall_s']:,.0f} s ({after['wall_s'] / 60:.1f} "
            f"min, {after['tests'] - after['skipped']} passed, {after['skipped']} skipped") in readme
    cut = read_json(REPO / "benchmarks" / "suite_runs" / "2026-11-27-fewer-launches.json")
    assert cut["before-4b8131d"] == after  # the same junit, read again
    now = cut["after-bdba859"]
    assert now["failures"] == 0
    assert (f"at bdba859 on the same machine: pytest {now['wall_s']:,.0f} s ({now['wall_s'] / 60:.1f} min, "
            f"{now['tests'] - now['skipped']} passed, {now['skipped']} skipped), {now['worker_s']:,.0f} s of worker "
            f"time against {after['worker_s']:,.0f} s") in readme
    fewer = read_json(REPO / "benchmarks" / "suite_runs" / "2026-12-02-fewer-processes.json")
    before, loaded, latest = fewer["before-617335c"], fewer["loaded-3ddfbc1"], fewer["after-c12d223"]
    assert before["failures"] == loaded["failures"] == latest["failures"] == 0
    assert (f"pytest {latest['wall_s']:,.0f} s ({latest['wall_s'] / 60:.1f} min; {latest['tests'] - latest['skipped']} "
            f"passed, {latest['skipped']} skipped), {latest['worker_s']:,.0f} s of worker time against "
            f"{before['worker_s']:,.0f} s in the third run above at 617335c (pytest {before['wall_s']:,.0f} s)"
            ) in readme
    assert f"running beside it, {loaded['wall_s']:,.0f} s, not a before figure" in readme
    refusals = read_json(REPO / "benchmarks" / "suite_runs" / "2026-12-02-fast-refusals.json")
    junit, steps, ci = refusals["after-aef203c"], refusals["make-test-steps-aef203c"], refusals["ci-fb66681"]
    assert junit["failures"] == 1 and abs(junit["wall_s"] - steps["pytest_s"]) < 2  # the junit is the timed pytest
    assert steps["setup_s"] + steps["pytest_s"] + steps["image_s"] == steps["total_s"]
    assert (f"the venv's set-up {steps['setup_s']} s, pytest {steps['pytest_s']:,} s ({steps['pytest_s'] / 60:.1f} "
            f"min; {junit['tests'] - junit['skipped'] - junit['failures']} passed, {junit['skipped']} skipped, "
            f"{junit['failures']} failed") in readme
    assert (f"{junit['worker_s']:,.0f} s of worker time, the image step {steps['image_s']} s: {steps['total_s']:,} s "
            f"in all, {steps['total_s'] / 60:.1f} min") in readme
    assert f"most of the drop from {latest['worker_s']:,.0f} s" in readme.lower()
    fast = refusals["fast-same-day"]
    early, late = fast["fb66681-0430utc"], fast["454eafb-0621utc"]
    assert (f"took {early['wall_s']} s ({early['worker_s']} s of worker time) at 04:30 UTC and {late['wall_s']} s "
            f"({late['worker_s']} s, with {late['passed'] - early['passed']} tests more) at 06:21") in readme
    moved = fast["f747266-0638utc"]
    assert f"took {moved['wall_s']} s ({moved['worker_s']} s of worker time) at 06:38" in readme
    module = fast["one_module_both_commits_0630utc"]
    times = module["fb66681_s"] + module["454eafb_s"]
    first = module["same_module_at_0430utc_s"]
    assert f"took {first} s in the first and {min(times)}-{max(times)} s run alone" in readme
    assert f"in {ci['total_s']:,} s ({ci['total_s'] / 60:.1f} min)" in readme
    current = " ".join(BENCHMARKS.read_text().split())
    assert (f"| `make test` | {steps['total_s'] / 60:.1f} min from a fresh clone (pytest {steps['pytest_s'] / 60:.1f} "
            "min) |") in current


def test_startup_before_tree_runs_that_checkout_s_code_and_the_after_side_this_one(tmp_path, monkeypatch):
    from benchmarks.startup import FLAG, side_settings

    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    env, cwd = side_settings("before", tmp_path)
    assert env == {FLAG: "1", "PYTHONPATH": f"{tmp_path}{os.pathsep}/elsewhere"} and cwd == tmp_path
    assert side_settings("after", tmp_path) == ({FLAG: "1"}, None)  # vLLM hidden on both sides
    assert side_settings("kept", None) == ({FLAG: "0"}, None) and side_settings("hidden", None) == ({FLAG: "1"}, None)
    # --as-user: the flag in neither environment, the recipe decides as for a user
    assert side_settings("before", tmp_path, as_user=True) == ({"PYTHONPATH": f"{tmp_path}{os.pathsep}/elsewhere"},
                                                               tmp_path)
    assert side_settings("after", tmp_path, as_user=True) == ({}, None)


def test_the_start_up_benchmark_counts_the_cpu_of_the_whole_process_tree():
    """A real parent with two children: each one's CPU counted once, sampled while they run."""
    import subprocess
    import sys
    import time

    from benchmarks.startup import TreeCPU

    spin = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.6: pass\ntime.sleep(30)"
    parent = subprocess.Popen([sys.executable, "-c", (
        "import subprocess, sys\n"
        f"kids = [subprocess.Popen([sys.executable, '-c', {spin!r}]) for _ in range(2)]\n"
        "[kid.wait() for kid in kids]")])
    tree = TreeCPU()
    tree.root = parent.pid
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            tree.sample()
            if sum(cpu for pid, (cpu, _) in tree.seen.items() if pid != parent.pid) >= 1.2:
                break
            time.sleep(0.2)
    finally:
        subprocess.run(["pkill", "-P", str(parent.pid)], check=False)
        parent.kill()
        parent.wait()
    totals = tree.totals()
    assert totals["processes"] == 3 and totals["idle_workers"] == 0, tree.seen
    assert 1.2 <= totals["cpu_s"] < 10, tree.seen  # two children's 0.6 s of spinning each, the parent's start-up


def test_the_lazy_registration_start_up_figures_are_what_benchmarks_md_quotes():
    from benchmarks.startup import summary as startup_summary

    recorded = read_json(REPO / "benchmarks" / "startup_runs" / "2026-11-27-lazy-registrations.json")
    found = startup_summary(recorded["runs"], ("before", "after"))
    assert found == recorded["summary"] and found["identical_logged_values"]
    flat = " ".join(HISTORY.read_text().split())
    before, after = found["before"], found["after"]
    first = ", ".join(map(str, before["first_step_s"])), ", ".join(map(str, after["first_step_s"]))
    wall = ", ".join(map(str, before["wall_s"])), ", ".join(map(str, after["wall_s"]))
    assert f"| command to verl's first step line, s | {first[0]} | {first[1]} |" in flat
    assert f"| command to exit, s | {wall[0]} | {wall[1]} |" in flat
    assert f"the {found['logged_values_a_run']} values each run logged" in flat
    gaps = [b - a for b, a in zip(before["first_step_s"], after["first_step_s"], strict=True)]  # pair by pair
    assert all(8.5 <= gap < 10 for gap in gaps)
    assert f"({gaps[0]:.1f} and {gaps[1]:.1f} s)" in flat  # "about 9 s less to the first step in each pair"


def test_the_driver_hide_and_idle_worker_figures_are_what_benchmarks_md_quotes():
    from benchmarks.startup import summary as startup_summary

    recorded = read_json(REPO / "benchmarks" / "startup_runs" / "2026-11-27-driver-hide-prestart.json")
    assert recorded["command"].endswith("--as-user") and all("cpu_s" in run for run in recorded["runs"])
    found = startup_summary(recorded["runs"], ("before", "after"))
    assert found == recorded["summary"] and found["identical_logged_values"]
    flat = " ".join(HISTORY.read_text().split())
    before, after = found["before"], found["after"]
    for label, key in (("CPU of the whole process tree, s", "cpu_s"), ("Ray workers idle at the end", "idle_workers"),
                       ("command to verl's first step line, s", "first_step_s")):
        row = f"| {label} | {', '.join(map(str, before[key]))} | {', '.join(map(str, after[key]))} |"
        assert row in flat, row
    assert f"the {found['logged_values_a_run']} values each run logged" in flat
    assert min(before["idle_workers"]) > max(after["idle_workers"])  # "fall from 3 to 1 in both pairs"
    loads = [load for side in (before, after) for load in side["load_before"]]
    assert f"load average {min(loads):.1f}-{max(loads):.1f}" in flat


def test_the_idle_driver_hide_and_idle_worker_figures_are_what_benchmarks_md_quotes():
    from benchmarks.startup import summary as startup_summary

    name = "2026-11-27-driver-hide-prestart-idle.json"
    recorded = read_json(REPO / "benchmarks" / "startup_runs" / name)
    assert recorded["command"].endswith("--as-user")
    found = startup_summary(recorded["runs"], ("before", "after"))
    assert found == recorded["summary"] and found["identical_logged_values"]
    flat = " ".join(HISTORY.read_text().split())
    assert name in flat
    before, after = found["before"], found["after"]
    for label, key in (("CPU of the whole process tree, s", "cpu_s"), ("Ray workers idle at the end", "idle_workers"),
                       ("command to verl's first step line, s", "first_step_s"), ("command to exit, s", "wall_s")):
        row = f"| {label} | {', '.join(map(str, before[key]))} | {', '.join(map(str, after[key]))} |"
        assert row in flat, row
    processes = [[run["processes"] for run in recorded["runs"] if run["side"] == side]
                 for side in ("before", "after")]
    counts = [", ".join(map(str, side)) for side in processes]
    assert f"| processes in the tree | {counts[0]} | {counts[1]} |" in flat
    # pairs in the order before, after, after, before: pair 1 is runs 0 and 1, pair 2 runs 3 and 2
    runs = recorded["runs"]
    cpu_gaps = [runs[0]["cpu_s"] - runs[1]["cpu_s"], runs[3]["cpu_s"] - runs[2]["cpu_s"]]
    step_gaps = [runs[0]["first_step_s"] - runs[1]["first_step_s"], runs[3]["first_step_s"] - runs[2]["first_step_s"]]
    assert f"({cpu_gaps[0]:.1f} and {cpu_gaps[1]:.1f} s)" in flat
    assert f"fell by {step_gaps[0]:.1f} s in the first pair and {step_gaps[1]:.1f} s in the second" in flat
    loads = [load for side in (before, after) for load in side["load_before"]]
    assert f"load average {min(loads):.1f}-{max(loads):.1f}" in flat


def assert_demo_table(run: dict, work: dict, validations: int) -> tuple[dict, float, list[float], str]:
    """A `make demo` table of the history (its rows as the two timed sections write them) recomputed from the run's
    parsed log and the model work measured after it; returns the run's summary, summed step time, validation times and
    the flattened history for the section's own sentences."""
    found = summary(run)
    steps = run["steps"]
    step_sum = sum(v["timing_s"]["step"] for v in steps.values() if "step" in v["timing_s"])
    testing = list(found["testing_s"].values())
    assert len(testing) == validations and sorted(int(s) for s in steps if "step" in steps[s]["timing_s"]) == list(
        range(1, 101))
    flat = " ".join(HISTORY.read_text().split())
    for label, value, fmt in (
        ("command to exit (`time`)", found["wall_s"], ",.1f"),
        ("100 steps (`timing_s/step`, summed)", step_sum, ".1f"),
        (f"{validations} validations during training (`timing_s/testing`)", sum(testing), ".1f"),
        ("the rest: start-up, validation before training, plots, shut-down", found["outside_steps_s"], ".1f"),
        ("median step (steps 2-100)", found["median_s"]["step"], ".2f"),
        ("median validation", statistics.median(testing), ".1f"),
        ("model work of a step (8 x 8 decoded as one batch, then forward + backward + GainAdamW)",
         work["step_model_work_s"], ".2f"),
        ("decode of a validation's 64 x 8", work["decode_validation_s"], ".2f"),
    ):
        assert f"| {label} | {value:{fmt}} |" in flat, label
    assert f"a step is {found['median_s']['step'] / work['step_model_work_s']:.1f}x its model work" in flat
    assert f"a validation {statistics.median(testing) / work['decode_validation_s']:.1f}x its decode" in flat
    return found, step_sum, testing, flat


def test_the_make_demo_table_is_recomputed_from_its_files():
    """The history, "make demo timed again": every figure of its table from the two JSON files."""
    folder = REPO / "benchmarks" / "testbed_runs"
    run = read_json(folder / "2026-11-27-make-demo.json")["make-demo"]
    work = read_json(folder / "2026-11-27-make-demo-model-work.json")
    found, step_sum, testing, flat = assert_demo_table(run, work, validations=10)
    assert f"`make demo` takes {found['wall_s'] / 60:.1f} min here" in flat
    shares = f"the steps are {step_sum / found['wall_s']:.0%} of it and the ten validations"
    assert shares in flat.replace(" %", "%") and f"{sum(testing) / found['wall_s']:.0%}" in flat.replace(" %", "%")


BOOTSTRAP_ORDER = ("before-first", "after-second", "after-first", "before-second")


def test_the_vectorised_bootstrap_timings_are_what_benchmarks_md_quotes_and_the_runs_logged_the_same_numbers():
    """The history, "a validation's bootstrap vectorised": its table and ranges from the four runs' parsed logs, and
    the claim that every value the four runs logged (timings aside) is the same."""
    folder = REPO / "benchmarks" / "testbed_runs"
    runs = read_json(folder / "2026-11-27-vectorised-bootstrap.json")
    found = {name: summary(runs[name]) for name in BOOTSTRAP_ORDER}
    table = [found[name] for name in BOOTSTRAP_ORDER]
    text = HISTORY.read_text()
    assert_trainer_rows(text, table, "5, 10, 15, 20")
    flat = " ".join(text.split())

    def testing(prefix: str) -> list[float]:
        chosen = (found[name]["testing_s"].values() for name in BOOTSTRAP_ORDER if name.startswith(prefix))
        return sorted(value for values in chosen for value in values)

    after, before = testing("after"), testing("before")
    assert (f"A validation takes {after[0]:.1f}-{after[-1]:.1f} s against {before[0]:.1f}-{before[-1]:.1f} s** "
            f"(medians {statistics.median(after):.1f} and {statistics.median(before):.1f} s)") in flat
    logged = read_json(folder / "2026-11-27-vectorised-bootstrap-metrics.json")["runs"]
    first, *others = (logged[name] for name in BOOTSTRAP_ORDER)
    assert sorted(first, key=int) == [str(step) for step in range(1, 21)] and all(run == first for run in others)
    assert any("/best@8/mean" in key for key in first["5"])  # the bootstrap's own estimates are among them
    count = sum(len(metrics) for metrics in first.values())
    assert f"the {count:,} values each run logged other than timings" in flat


def test_the_make_demo_every_20_table_and_readmes_demo_row_are_recomputed_from_their_files():
    """The history, "make demo with the bootstrap vectorised and six validations", and README.md's demo table: every
    figure from the three JSON files of that run (where a step goes: docs/findings.md; BENCHMARKS.md's whole jobs)."""
    folder = REPO / "benchmarks" / "testbed_runs"
    run = read_json(folder / "2026-11-27-make-demo-every-20.json")["make-demo"]
    work = read_json(folder / "2026-11-27-make-demo-every-20-model-work.json")
    demo = read_json(folder / "2026-11-27-make-demo-every-20-summary.json")
    earlier = read_json(folder / "2026-11-27-make-demo.json")["make-demo"]
    found, step_sum, testing, flat = assert_demo_table(run, work, validations=5)
    steps = run["steps"]
    assert sorted(found["testing_s"]) == [20, 40, 60, 80, 100]
    assert f"of which the 100 steps are {step_sum / found['wall_s']:.0%}" in flat.replace(" %", "%")
    held_out = {int(s): v["held_out_acc"] for s, v in steps.items() if v["held_out_acc"] is not None}
    assert all(earlier["steps"][str(s)]["held_out_acc"] == acc for s, acc in held_out.items())  # "value for value"
    # README.md's demo row
    train = {int(s): v for s, v in demo["train_acc"].items()}
    first, last = (statistics.mean(train[s] for s in range(a, a + 10)) for a in (1, 91))
    assert (demo["summary"]["heldout_acc_before"], demo["summary"]["heldout_acc_after"]) == (held_out[0], held_out[100])
    row = (f"| `stapo demo` (testbed, STAPO) | {held_out[0]:.3f} -> {held_out[100]:.3f} "
           f"({held_out[20]:.3f} at step 20, {held_out[40]:.3f} at 40 and 60, {held_out[80]:.3f} at 80) | "
           f"{first:.2f} -> {last:.2f} | "
           f"{found['wall_s'] / 60:.1f} min (model cached) | {found['median_s']['step']:.1f} | "
           f"{demo['summary']['peak_rss_gib']:.1f} GiB |")
    assert held_out[40] == held_out[60]
    assert row in " ".join((REPO / "README.md").read_text().split())
    findings = " ".join((REPO / "docs" / "findings.md").read_text().split())
    phases = found["median_s"]
    assert (f"generation {phases['gen']:.2f} s (the 8 prompts' groups decoded as one batch), old log-probs "
            f"{phases['old_log_prob']:.2f} s, update {phases['update_actor']:.2f} s; each validation "
            f"{min(testing):.1f}-{max(testing):.1f} s") in findings
    current = " ".join(BENCHMARKS.read_text().split())
    assert (f"| {found['wall_s'] / 60:.1f} min, {found['median_s']['step']:.1f} s a step (median) | 2026-11-27, 2-core "
            "AMD EPYC (AVX2): \"(seventh)\" |") in current


def pooled_runs(found: dict, names: tuple, prefix: str, key: str) -> list[float]:
    """The sorted values of ``key`` (a phase's median, or every validation's time for ``testing``) over the runs of
    ``names`` whose name starts with ``prefix``: one arm of an A/B."""
    chosen = [found[name] for name in names if name.startswith(prefix)]
    if key == "testing":
        return sorted(v for run in chosen for v in run["testing_s"].values())
    return sorted(run["median_s"][key] for run in chosen)


HOPS_SETTINGS = ("base-1", "hops-1", "hops2w-1", "hops2w-2", "hops-2", "base-2")
HOPS_DEFAULTS = ("new-1", "new-2", "old-a", "old-b", "new-3")


def test_the_agent_loop_hops_timings_are_what_benchmarks_md_quotes_and_the_runs_logged_the_same_numbers():
    """The history, "the agent-loop worker's hops": both tables, the ranges and ratios under them from the eleven
    runs' parsed logs and the model work, and the claim that every run logged the same values (one run's kept, every
    run's SHA-256)."""
    folder = REPO / "benchmarks" / "testbed_runs"
    runs = read_json(folder / "2026-11-27-agent-loop-hops.json")
    work = read_json(folder / "2026-11-27-agent-loop-hops-model-work.json")
    text = HISTORY.read_text()
    found = {name: summary(runs[name]) for name in HOPS_SETTINGS + HOPS_DEFAULTS}
    assert_trainer_rows(text, [found[name] for name in HOPS_SETTINGS], "5, 10, 15, 20")
    assert_trainer_rows(text, [found[name] for name in HOPS_DEFAULTS], "5, 10, 15, 20")
    flat = " ".join(text.split())

    def pooled(prefix: str, key: str) -> list[float]:
        return pooled_runs(found, HOPS_DEFAULTS, prefix, key)

    new, old = pooled("new", "testing"), pooled("old", "testing")
    gen_new, gen_old = pooled("new", "gen"), pooled("old", "gen")
    assert (f"`gen` {gen_new[0]:.2f}-{gen_new[-1]:.2f} s against {gen_old[0]:.2f}-{gen_old[-1]:.2f} s, a validation "
            f"{new[0]:.1f}-{new[-1]:.1f} s against {old[0]:.1f}-{old[-1]:.1f} s (medians {statistics.median(new):.1f} "
            f"and {statistics.median(old):.1f} s)") in flat
    assert (f"decoded as one batch {work['decode_step_s']:.2f} s, forward + backward + GainAdamW "
            f"{work['update_s']:.2f} s, so {work['step_model_work_s']:.2f} s a step; the validation's 64 x 8 decoded "
            f"{work['decode_validation_s']:.2f} s") in flat
    step = work["step_model_work_s"]
    step_new, step_old = statistics.median(pooled("new", "step")), statistics.median(pooled("old", "step"))
    decode, val_new, val_old = work["decode_validation_s"], statistics.median(new), statistics.median(old)
    assert (f"the step is {step_new / step:.1f}x its model work ({step_old / step:.1f}x before) and a validation "
            f"{val_new / decode:.1f}x its decode ({val_old / decode:.1f}x before)") in flat
    logged = read_json(folder / "2026-11-27-agent-loop-hops-metrics.json")
    kept = logged["runs"]["base-1"]
    digest = hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()
    assert sorted(logged["sha256"]) == sorted(HOPS_SETTINGS + HOPS_DEFAULTS)
    assert set(logged["sha256"].values()) == {digest}  # every run's values hash to the kept run's
    assert sorted(kept, key=int) == [str(step) for step in range(1, 21)]
    count = sum(len(metrics) for metrics in kept.values())
    assert f"the {count:,} values each of the 11 runs logged other than timings" in flat
    # the py-spy figures the section quotes are the profile file's
    profile = (folder / "2026-11-27-agent-loop-worker-profile.txt").read_text()
    seconds = {name: line.split()[1] for line in profile.splitlines() if line.startswith("incl ")
               for name in [line.split(maxsplit=2)[2]]}
    assert (f"({seconds['deepcopy']} s against {seconds['RewardLoopWorker.compute_score']} s in "
            "`RewardLoopWorker.compute_score`") in flat
    assert (f"of the {seconds['SharedLoopWorker._run_agent_loop']} s the py-spy found in its `_run_agent_loop`, "
            f"TransferQueue's put (`async_kv_batch_put`) took {seconds['async_kv_batch_put']} s and the trajectory's "
            f"TensorDict (`list_of_dict_to_tensordict`) {seconds['list_of_dict_to_tensordict']} s") in flat


def load_ab(stem: str, names: tuple) -> tuple[dict, dict, str]:
    """An A/B of 20-step testbed runs under benchmarks/testbed_runs/<stem>*.json: each run's summary and the model
    work, after checking the history's table (one column a run, in ``names``' order); and the flattened file."""
    folder = REPO / "benchmarks" / "testbed_runs"
    runs = read_json(folder / f"{stem}.json")
    work = read_json(folder / f"{stem}-model-work.json")
    text = HISTORY.read_text()
    found = {name: summary(runs[name]) for name in names}
    assert_trainer_rows(text, [found[name] for name in names], "5, 10, 15, 20")
    return found, work, " ".join(text.split())


def logged_alike(stem: str, names: tuple, kept: str) -> tuple[str, int]:
    """The SHA-256 of the kept run's logged values, which every run's must equal, and how many values it holds."""
    logged = read_json(REPO / "benchmarks" / "testbed_runs" / f"{stem}-metrics.json")
    values = logged["runs"][kept]
    digest = hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()
    assert sorted(logged["sha256"]) == sorted(names) and set(logged["sha256"].values()) == {digest}
    return digest, sum(len(metrics) for metrics in values.values())


TWO_WORKERS = ("two-1", "one-1", "one-2", "two-2")


def test_the_two_agent_loop_workers_timings_are_what_benchmarks_md_quotes_and_the_runs_logged_the_same_numbers():
    """The history, "two agent-loop workers": the table, the ranges, medians and ratios under it from the four runs'
    parsed logs and the model work, and every run's logged values hashing to the kept run's."""
    found, work, flat = load_ab("2026-11-28-two-agent-loop-workers", TWO_WORKERS)

    def pooled(prefix: str, key: str) -> list[float]:
        return pooled_runs(found, TWO_WORKERS, prefix, key)

    two, one = pooled("two", "testing"), pooled("one", "testing")
    assert (f"{two[0]:.1f}-{two[-1]:.1f} s against {one[0]:.1f}-{one[-1]:.1f} s (medians "
            f"{statistics.median(two):.1f} and {statistics.median(one):.1f} s)") in flat
    gen_two, gen_one = pooled("two", "gen"), pooled("one", "gen")
    assert f"`gen` {gen_two[0]:.2f}-{gen_two[-1]:.2f} s against {gen_one[0]:.2f}-{gen_one[-1]:.2f} s" in flat
    assert (f"decoded as one batch {work['decode_step_s']:.2f} s, forward + backward + GainAdamW "
            f"{work['update_s']:.2f} s, so {work['step_model_work_s']:.2f} s a step; the validation's 64 x 8 decoded "
            f"{work['decode_validation_s']:.2f} s") in flat
    step, decode = work["step_model_work_s"], work["decode_validation_s"]
    ratios = {round(statistics.median(pooled(p, "step")) / step, 1) for p in ("one", "two")}
    assert ratios == {2.1} and "the step is 2.1x its model work either way" in flat
    assert (f"a validation {statistics.median(two) / decode:.1f}x its decode ({statistics.median(one) / decode:.1f}x "
            "with one worker)") in flat
    outside = " and ".join(f"{found[name]['outside_steps_s']:.1f}" for name in ("two-1", "two-2"))
    assert f"{outside} s with two workers" in flat
    _, count = logged_alike("2026-11-28-two-agent-loop-workers", TWO_WORKERS, "one-1")
    assert f"the four runs logged the same {count:,} values other than timings" in flat


def test_the_make_demo_on_the_xeon_table_is_recomputed_from_its_files():
    """The history, "make demo on an Intel Xeon": its table, shares, ratios and accuracies from the three files."""
    folder = REPO / "benchmarks" / "testbed_runs"
    run = read_json(folder / "2026-11-28-make-demo-xeon.json")["make-demo"]
    work = read_json(folder / "2026-11-28-make-demo-xeon-model-work.json")
    demo = read_json(folder / "2026-11-28-make-demo-xeon-summary.json")
    found, step_sum, testing, flat = assert_demo_table(run, work, validations=5)
    flat = flat.replace(" %", "%")
    assert f"`make demo` took {found['wall_s'] / 60:.1f} min against the goal of 4" in flat
    assert (f"the 100 steps are {step_sum / found['wall_s']:.0%} of it, the five validations "
            f"{sum(testing) / found['wall_s']:.0%}") in flat
    held_out = {int(s): v["held_out_acc"] for s, v in run["steps"].items() if v["held_out_acc"] is not None}
    assert (demo["summary"]["heldout_acc_before"], demo["summary"]["heldout_acc_after"]) == (held_out[0], held_out[100])
    train = {int(s): v for s, v in demo["train_acc"].items()}
    first, last = (statistics.mean(train[s] for s in range(a, a + 10)) for a in (1, 91))
    assert (f"rose from {held_out[0]:.3f} before training to {held_out[100]:.3f} at step 100, the training accuracy "
            f"(mean of steps 1-10, then 91-100) from {first:.2f} to {last:.2f}") in flat


def test_the_last_make_demo_on_the_xeon_is_recomputed_from_its_files_and_trained_as_the_tenth_sections_run():
    """The history, "(fifteenth)": the demo's table, shares and ratios from its three files; its held-out accuracy
    at every validation and its training accuracy at every step are the tenth section's run's (the same run, bit for
    bit, across the changes between them); docs/findings.md and BENCHMARKS.md quote its time."""
    folder = REPO / "benchmarks" / "testbed_runs"
    run = read_json(folder / "2026-11-28-make-demo-xeon-final.json")["make-demo"]
    work = read_json(folder / "2026-11-28-make-demo-xeon-final-model-work.json")
    demo = read_json(folder / "2026-11-28-make-demo-xeon-final-summary.json")
    tenth = read_json(folder / "2026-11-28-make-demo-xeon.json")["make-demo"]
    tenth_demo = read_json(folder / "2026-11-28-make-demo-xeon-summary.json")
    found, step_sum, testing, flat = assert_demo_table(run, work, validations=5)
    flat = flat.replace(" %", "%")
    earlier = summary(tenth)
    assert (f"`make demo` took {found['wall_s'] / 60:.1f} min ({earlier['wall_s'] / 60:.1f} min in the tenth section, "
            "on this kind)") in flat
    assert (f"the 100 steps are {step_sum / found['wall_s']:.0%} of it, the five validations "
            f"{sum(testing) / found['wall_s']:.0%}, start-up, the validation before training, plots and shut-down the "
            f"rest ({found['outside_steps_s']:.1f} s)") in flat
    held_out = {int(s): v["held_out_acc"] for s, v in run["steps"].items() if v["held_out_acc"] is not None}
    assert held_out == {int(s): v["held_out_acc"] for s, v in tenth["steps"].items() if v["held_out_acc"] is not None}
    assert sorted(held_out) == [0, 20, 40, 60, 80, 100] and len(demo["train_acc"]) == 100
    assert demo["train_acc"] == tenth_demo["train_acc"]
    assert f"({held_out[0]:.3f} before training, {held_out[100]:.3f} at step 100)" in flat
    findings = " ".join((REPO / "docs" / "findings.md").read_text().split())
    assert (f"same command took {found['wall_s'] / 60:.1f} min, {found['median_s']['step']:.1f} s a step (median); its "
            f"held-out accuracy, {held_out[0]:.3f} -> {held_out[100]:.3f}, is that machine's build") in findings
    current = " ".join(BENCHMARKS.read_text().split())
    assert (f"| {found['wall_s'] / 60:.1f} min, {found['median_s']['step']:.1f} s a step (median) | 2026-11-28, 2-core "
            "Intel Xeon (AVX-512): \"(fifteenth)\" |") in current


def test_the_one_seed_make_compare_is_what_benchmarks_md_quotes_and_extrapolates():
    """The history, "(fifteenth)": the one-seed `make compare`'s wall time, each sweep's span and the runs' range from
    the runs' records, and the whole comparison extrapolated from them (the first sweep 5 times, the second 3 times, as
    the Makefile's default seeds); every run finished, on one kind of machine."""
    record = read_json(REPO / "benchmarks" / "testbed_runs" / "2026-11-28-make-compare-one-seed.json")
    runs = record["runs"]
    assert record["rc"] == 0 and all(run["returncode"] == 0 for run in runs) and len({r["machine"] for r in runs}) == 1
    assert sorted(r["cell"] for r in runs) == sorted(record["first_sweep"] + record["second_sweep"])
    makefile = (REPO / "Makefile").read_text()
    assert "COMPARE_SEEDS ?= 1,2,3,4,5" in makefile and "COMPARE_MORE_SEEDS ?= 1,2,3" in makefile
    for cells in (record["first_sweep"], record["second_sweep"]):
        assert f"--grid algo={','.join(cell.split('=')[1] for cell in cells)}" in makefile

    def span(cells: list[str]) -> float:
        mine = [run for run in runs if run["cell"] in cells]
        return max(run["finished_at"] for run in mine) - min(run["started_at"] for run in mine)

    first, second = span(record["first_sweep"]), span(record["second_sweep"])
    seconds = sorted(run["seconds"] for run in runs)
    flat = " ".join(HISTORY.read_text().split())
    for label, value in (("command to exit", f"{record['wall_s']:,.1f}"),
                         ("first sweep (JustRL, STAPO, GRPO, 20-Entropy): first start to last end", f"{first:.1f}"),
                         ("second sweep (DAPO, Dr. GRPO, GSPO, CISPO): first start to last end", f"{second:.1f}"),
                         ("a run (two at a time), shortest to longest", f"{seconds[0]:.1f}-{seconds[-1]:.1f}")):
        assert f"| {label} | {value} |" in flat, label
    whole = 5 * first + 3 * second
    assert (f"about 5 x {first:.1f} + 3 x {second:.1f} = {whole:,.0f} s, {whole / 60:.1f} min, against the issue's "
            "goal of 1 hour: not met") in flat
    assert f"takes {seconds[0] / 60:.1f}-{seconds[-1] / 60:.1f} min" in flat
    assert f"(about {whole / 3600:.1f} h, above)" in flat
    current = " ".join(BENCHMARKS.read_text().split())
    assert f"| about {whole / 3600:.1f} h, from one seed of each sweep |" in current


GROUP_PUTS = ("grouped-1", "persample-1", "persample-2", "grouped-2")


def test_the_group_puts_timings_are_what_benchmarks_md_quotes_and_the_runs_logged_the_same_numbers():
    """The history, "a group's samples put at once": the table, ranges, medians and ratios from the four runs' parsed
    logs and the model work; every run's logged values hash to the kept run's, which is the ninth section's hash."""
    found, work, flat = load_ab("2026-11-28-group-puts", GROUP_PUTS)

    def pooled(prefix: str, key: str) -> list[float]:
        return pooled_runs(found, GROUP_PUTS, prefix, key)

    grouped, alone = pooled("grouped", "testing"), pooled("persample", "testing")
    assert (f"a validation {grouped[0]:.1f}-{grouped[-1]:.1f} s grouped against {alone[0]:.1f}-{alone[-1]:.1f} s per "
            f"sample (medians {statistics.median(grouped):.1f} and {statistics.median(alone):.1f} s)") in flat
    gen_grouped, gen_alone = pooled("grouped", "gen"), pooled("persample", "gen")
    assert (f"`gen` {gen_grouped[0]:.2f}-{gen_grouped[-1]:.2f} s against {gen_alone[0]:.2f}-{gen_alone[-1]:.2f} s"
            in flat)
    step, decode = work["step_model_work_s"], work["decode_validation_s"]
    assert f"model work ({step:.2f} s a step, the validation's decode {decode:.2f} s)" in flat
    ratios = {round(statistics.median(pooled(p, "step")) / step, 1) for p in ("grouped", "persample")}
    assert ratios == {1.9} and "a step is 1.9x its model work either way" in flat
    assert (f"a validation {statistics.median(grouped) / decode:.1f}x its decode grouped "
            f"({statistics.median(alone) / decode:.1f}x per sample)") in flat
    digest, count = logged_alike("2026-11-28-group-puts", GROUP_PUTS, "grouped-1")
    ninth, _ = logged_alike("2026-11-28-two-agent-loop-workers", TWO_WORKERS, "one-1")
    assert digest == ninth  # "the same SHA-256 as the four runs of the ninth section"
    assert f"the four runs logged the same {count:,} values other than timings, with the same SHA-256" in flat


def test_the_twelfth_sections_profile_figures_are_the_profile_files_and_the_draw_tables():
    """The history's "(twelfth)" section: the py-spy seconds it quotes are those of its profile file, and the
    draw's ratios and times those of section 8's table."""
    text = " ".join(HISTORY.read_text().split())
    profile = (REPO / "benchmarks" / "testbed_runs" / "2026-11-28-tailbed-run-pyspy.txt").read_text()
    on_cpu, frames, process = {}, {}, None
    for line in profile.splitlines():
        if line.startswith("== "):
            process, seconds = line[3:].split(": ")
            on_cpu[process] = seconds.split()[0]
        elif process and line.strip().endswith(")"):
            seconds, _, frame = line.split(maxsplit=2)
            frames[(process, frame.split(" (")[0])] = float(seconds)
    server = "HFGenerationServer"
    assert (f"puts {frames[(server, 'sample_batch')]:.1f} of the HF server's {on_cpu[server]} s on CPU in "
            f"`sample_batch`, and of those {frames[(server, 'draw_tokens')]:.1f} s in drawing the tokens") in text
    assert f"against {frames[(server, 'Qwen3ForCausalLM.forward')]:.1f} s in the model's forward passes" in text
    post = {frames[(f"SharedLoopWorker ({i})", "AgentLoopWorkerTQ._agent_loop_postprocess")] for i in (1, 2)}
    assert (f"The two agent-loop workers were on CPU {on_cpu['SharedLoopWorker (1)']} and "
            f"{on_cpu['SharedLoopWorker (2)']} s (verl's post-processing of a sample, "
            f"{min(post):.1f} s each)") in text and max(post) - min(post) < 0.1
    assert (f"the FSDP worker {on_cpu['WorkerDict (FSDP actor)']} s, the driver "
            f"{on_cpu['TaskRunnerV1 (driver)']} s") in text
    rows = {}
    section = BENCHMARKS.read_text().split("<!-- bench:draw -->")[1].split("<!-- /bench:draw -->")[0]
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if len(cells) == 7 and cells[0][0].isdigit():
            rows[(cells[0], cells[1])] = (cells[2], cells[3], float(cells[4]), cells[5])
    assert all(same == "yes" for *_, same in rows.values())
    small = [ratio for (shape, _), (_, _, ratio, _) in rows.items() if shape.endswith(" x 27")]
    large = [ratio for (shape, _), (_, _, ratio, _) in rows.items() if shape.endswith(" x 4096")]
    old, new, *_ = rows[("512 x 27", "1 / 1")]
    assert (f"at the testbed's vocabulary of 27 the race takes {min(small):.2f}-{max(small):.2f}x the time of a call "
            f"a row (512 rows: {old} ms against {new} ms); at the tailbed's 4,096 it takes as long "
            f"({min(large):.2f}-{max(large):.2f}x") in text


RACE = ("multinomial-1", "race-1", "race-2", "multinomial-2")


def test_the_exponential_race_timings_are_what_benchmarks_md_quotes_and_the_runs_logged_the_same_numbers():
    """The history, "the exponential race in the trainer": the table, ranges, medians and ratios from the four runs'
    parsed logs and the model work; every run's logged values hash to the kept run's, the eleventh section's hash."""
    found, work, flat = load_ab("2026-11-28-exponential-race", RACE)

    def pooled(prefix: str, key: str) -> list[float]:
        return pooled_runs(found, RACE, prefix, key)

    gen_race, gen_old = pooled("race", "gen"), pooled("multinomial", "gen")
    assert f"`gen` {gen_race[0]:.2f}-{gen_race[-1]:.2f} s against {gen_old[0]:.2f}-{gen_old[-1]:.2f} s" in flat
    race, old = pooled("race", "testing"), pooled("multinomial", "testing")
    assert (f"A validation {race[0]:.1f}-{race[-1]:.1f} s against {old[0]:.1f}-{old[-1]:.1f} s (medians "
            f"{statistics.median(race):.1f} and {statistics.median(old):.1f} s)") in flat
    upd_race, upd_old = pooled("race", "update_actor"), pooled("multinomial", "update_actor")
    assert f"also reads {upd_race[0]:.2f}-{upd_race[-1]:.2f} s against {upd_old[0]:.2f}-{upd_old[-1]:.2f} s" in flat
    step, decode = work["step_model_work_s"], work["decode_validation_s"]
    assert f"model work ({step:.2f} s a step, the validation's decode {decode:.2f} s)" in flat
    ratio = {p: statistics.median(pooled(p, "step")) / step for p in ("race", "multinomial")}
    val = {p: statistics.median(pooled(p, "testing")) / decode for p in ("race", "multinomial")}
    assert (f"a step is {ratio['race']:.1f}x its model work with the race ({ratio['multinomial']:.1f}x before) and a "
            f"validation {val['race']:.1f}x its decode ({val['multinomial']:.1f}x before)") in flat
    digest, count = logged_alike("2026-11-28-exponential-race", RACE, "race-1")
    earlier, _ = logged_alike("2026-11-28-group-puts", GROUP_PUTS, "grouped-1")
    assert digest == earlier and f"the four runs logged the same {count:,} values other than timings" in flat


EARLY = ("ab-before-1", "ab-early-1", "ab-early-2", "ab-before-2")


def test_the_early_hand_over_timings_are_what_benchmarks_md_quotes_and_the_runs_logged_the_same_numbers():
    """The history, "each request answered when its row ends": the table, ranges, medians and ratios from the four
    runs' parsed logs and the model work (with the validation rows' token counts); every run's logged values hash to
    the kept run's, the thirteenth section's hash."""
    found, work, flat = load_ab("2026-11-28-early-hand-over", EARLY)

    def pooled(prefix: str, key: str) -> list[float]:
        return pooled_runs(found, EARLY, prefix, key)

    tokens = work["validation_row_tokens"]
    assert (f"a quarter of the rows ended by token {tokens['q25']}, half by {tokens['median']}, 95 % by "
            f"{tokens['q95']}, the longest at {tokens['max']}, the limit") in flat and tokens["max"] == 64
    early, late = pooled("ab-early", "testing"), pooled("ab-before", "testing")
    assert (f"a validation {early[0]:.1f}-{early[-1]:.1f} s answered when the row ends against {late[0]:.1f}-"
            f"{late[-1]:.1f} s answered at the batch's end (medians {statistics.median(early):.1f} and "
            f"{statistics.median(late):.1f} s)") in flat
    gen_early, gen_late = pooled("ab-early", "gen"), pooled("ab-before", "gen")
    assert f"`gen` {gen_early[0]:.2f}-{gen_early[-1]:.2f} s against {gen_late[0]:.2f}-{gen_late[-1]:.2f} s" in flat
    step, decode = work["step_model_work_s"], work["decode_validation_s"]
    assert f"model work ({step:.2f} s a step, the validation's decode {decode:.2f} s)" in flat
    ratios = {f"{statistics.median(pooled(p, 'step')) / step:.1f}" for p in ("ab-early", "ab-before")}
    assert len(ratios) == 1 and f"a step is {ratios.pop()}x its model work either way" in flat
    assert (f"a validation {statistics.median(early) / decode:.1f}x its decode with the change "
            f"({statistics.median(late) / decode:.1f}x without)") in flat
    digest, count = logged_alike("2026-11-28-early-hand-over", EARLY, "ab-early-1")
    earlier, _ = logged_alike("2026-11-28-exponential-race", RACE, "race-1")
    assert digest == earlier and f"the four runs logged the same {count:,} values other than timings" in flat
