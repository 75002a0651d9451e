"""What a new user meets first: the CPU presets' refusal of a model, data or device they were not made for,
`stapo check`'s summary, the inputs that used to slip through, `stapo --version`, `stapo train`'s refusals
and the ETA that counts validation.

The config is composed for real (``stapo.check.compose_run``, the recipe's Hydra composition), the CLI is
run through its ``main(argv)``, and the data files are small parquet / JSON-lines files written here.
"""

from __future__ import annotations

import json
import random
import sys
import traceback
from importlib.metadata import version
from pathlib import Path

import pandas as pd
import pytest

from stapo.algorithm.validation import STAPOConfigError
from stapo.check import check_run, compose_run
from stapo.cli import COMMANDS
from stapo.cli import main as stapo_main
from stapo.data.rows import rl_row, write_rows
from stapo.input_checks import check_data_file, check_inputs, planned_steps
from stapo.runs.progress import Progress, SweepClock, format_duration, validations_after

MODEL = "actor_rollout_ref.model.path"
OWN = "stapo.cpu_preset.allow_other_inputs=true"
CPU_PRESETS = ("tiny", "testbed", "tailbed", "smollm2")
COLUMNS = {"prompt": "data.prompt_key", "data_source": "data.reward_fn_key", "reward_model": "ground truth"}


def refused(overrides: list[str], paths: bool = False) -> str:
    with pytest.raises(STAPOConfigError) as error:
        check_run(compose_run(overrides), paths=paths)
    return str(error.value)


def rows(count: int) -> list[dict]:
    return [rl_row("t", f"{i} + 1 = ?", str(i + 1), {"index": i}) for i in range(count)]


# ---------------------------------------------------------------- the CPU presets' own inputs


@pytest.mark.parametrize("preset, misfit", [
    ("tiny", f"{MODEL}=Qwen/Qwen2.5-7B"), ("testbed", "data.train_files=/data/dapo/train.parquet"),
    ("tailbed", "data.val_files=[/data/aime24/test.parquet]"), ("smollm2", "trainer.device=cuda"),
    ("smollm2", f"{MODEL}=/models/SmolLM2-360M"),
])
def test_a_cpu_preset_refuses_a_model_data_or_device_it_was_not_made_for(preset, misfit):
    message = refused([f"model_preset={preset}", misfit])
    assert message.startswith(f"model_preset={preset} (") and "\n" not in message
    shown = misfit.replace("[", "").replace("]", "")  # a list's first file is named
    assert f"not for {shown}" in message, message
    assert "model_preset=qwen3_8b" in message and f"{MODEL}=..." in message and OWN in message
    # on purpose, the same config passes the preset's check (the device one goes on to the CPU back-end's own)
    if not misfit.startswith("trainer.device"):
        check_run(compose_run([f"model_preset={preset}", misfit, OWN]), paths=False)


@pytest.mark.parametrize("preset", CPU_PRESETS)
def test_a_cpu_preset_with_its_own_model_and_generated_data_passes(preset, tmp_path):
    check_run(compose_run([f"model_preset={preset}"]), paths=False)
    # its generated data moved elsewhere is still its own data
    check_run(compose_run([f"model_preset={preset}", f"stapo.synthetic_data_dir={tmp_path}/gen"]), paths=False)


def test_every_refused_setting_is_named_and_a_gpu_preset_takes_the_same_overrides():
    message = refused([f"{MODEL}=/models/mine", "data.train_files=/d/train.parquet", "trainer.device=cuda"])
    assert f"not for trainer.device=cuda and {MODEL}=/models/mine and data.train_files=/d/train.parquet" in message
    # the GPU presets say nothing of the kind: they are made for the user's model and data
    for preset in ("qwen3_8b", "qwen3_1p7b", "qwen3_14b", "qwen3_0p6b_smoke"):
        check_run(compose_run([f"model_preset={preset}", f"{MODEL}=/models/mine", "data.train_files=/d/t.parquet"]),
                  paths=False)


def test_the_issues_command_is_refused_in_one_line_naming_the_silent_default(capsys):
    """Leaving out model_preset= composes tiny: the issue's command printed OK for a 16-token, 3-step CPU run."""
    code = stapo_main(["check", "--no-paths", "algo=stapo", f"{MODEL}=Qwen/Qwen2.5-7B",
                       "data.train_files=/data/train.parquet"])
    captured = capsys.readouterr()
    assert code == 2 and "OK" not in captured.out
    (line,) = captured.err.splitlines()
    assert line.startswith("stapo: model_preset=tiny (the default preset, ")
    assert "data.max_response_length=16, trainer.total_training_steps=3" in line


# ---------------------------------------------------------------- stapo check's summary


def test_stapo_check_prints_the_values_a_user_looks_at_first(capsys, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert stapo_main(["check", "--no-paths", "model_preset=qwen3_8b", "algo=grpo",
                       "trainer.total_training_steps=50"]) == 0
    out = capsys.readouterr().out.splitlines()
    # conf/model_preset/_qwen3_paper.yaml and qwen3_8b.yaml, read by eye
    assert out[-9:] == [
        "[stapo] preset: model_preset=qwen3_8b, algo=grpo",
        "[stapo] device: cuda, 8 nodes x 8 GPUs = 64 GPUs (a Ray cluster of 8 nodes; RAY_ADDRESS is not set)",
        "[stapo] model: Qwen/Qwen3-8B-Base",
        "[stapo] batch: 256 prompts x 8 samples, responses up to 15360 tokens",
        "[stapo] steps: 50, validated every 20 steps and at the last and before training",
        "[stapo] rollout: vllm (async, tensor parallel 2)",
        "[stapo] reward: pkg://stapo.reward (compute_score)",
        ("[stapo] seed: data.seed=1, actor_rollout_ref.rollout.seed=42: a sweep's seed S sets both to S, so no sweep "
         "run pairs with this one (set both alike to pair)"),
        "OK",
    ]
    assert stapo_main(["check", "--no-paths", "model_preset=tiny", "trainer.total_training_steps=null",
                       "reward.custom_reward_function.path=null"]) == 0
    out = capsys.readouterr().out
    assert "[stapo] preset: model_preset=tiny, algo=stapo\n[stapo] device: cpu, 1 node x 1 worker\n" in out
    assert "[stapo] steps: trainer.total_epochs=1 pass(es) over the data, no validation\n" in out
    assert "[stapo] reward: verl's default_compute_score, by data_source\n" in out


def test_the_summary_names_the_users_rule_and_says_when_a_sweep_run_is_this_runs_pair(capsys, monkeypatch):
    """``algo=stapo`` alone would name a rule the run does not train with; a sweep's seed S sets both seeds."""
    rule = Path(__file__).resolve().parents[2] / "recipe" / "stapo" / "examples" / "taco_weight.py"
    assert stapo_main(["check", "--no-paths", "model_preset=tiny", f"stapo.custom_rule.path={rule}",
                       "stapo.custom_rule.name=taco_weight", "actor_rollout_ref.rollout.seed=1"]) == 0
    out = capsys.readouterr().out.splitlines()
    preset = out.index("[stapo] preset: model_preset=tiny, algo=stapo")
    assert out[preset + 1] == f"[stapo] token rule: custom:taco_weight from {rule} (replaces algo=stapo's rule)"
    assert "[stapo] seed: 1 (data order and rollouts; a sweep's --seeds 1 run is this run's pair)" in out


# ---------------------------------------------------------------- inputs that slipped through


def test_a_prompt_column_of_plain_strings_is_refused_in_parquet_and_json_lines(tmp_path):
    key = "data.train_files"
    plain = tmp_path / "plain.parquet"
    pd.DataFrame({"prompt": ["1 + 1 = ?"], "data_source": ["t"],
                  "reward_model": [{"ground_truth": "2"}]}).to_parquet(plain)
    with pytest.raises(STAPOConfigError) as error:
        check_data_file(key, str(plain), COLUMNS, set())
    assert str(error.value).startswith(f"{key}={plain}: column prompt holds plain strings, not chat messages")
    listed = write_rows(tmp_path / "listed.parquet", [{**rows(1)[0], "prompt": ["1 + 1 = ?"]}])
    with pytest.raises(STAPOConfigError, match="column prompt holds list<"):
        check_data_file(key, str(listed), COLUMNS, set())
    assert "parquet, 3 rows" in check_data_file(key, str(write_rows(tmp_path / "ok.parquet", rows(3))), COLUMNS, set())

    def jsonl(name: str, row: dict) -> str:
        path = tmp_path / name
        path.write_text("\n" + json.dumps(row) + "\n")
        return str(path)

    good = rows(1)[0]
    assert "JSON lines" in check_data_file(key, jsonl("ok.jsonl", good), COLUMNS, set())
    for name, row, message in [
        ("plain.jsonl", {**good, "prompt": "1 + 1 = ?"}, "column prompt holds a plain string, not chat messages"),
        ("lacks.jsonl", {"question": "1 + 1", "answer": "2"}, "lacks column(s) ['prompt (data.prompt_key)'"),
        ("roles.jsonl", {**good, "prompt": [{"text": "1 + 1"}]}, "column prompt holds list, not chat messages"),
    ]:
        with pytest.raises(STAPOConfigError) as error:
            check_data_file(key, jsonl(name, row), COLUMNS, set())
        assert str(error.value).startswith(f"{key}={tmp_path / name}: ") and message in str(error.value), error.value


def test_stapo_check_refuses_plain_string_prompts_in_one_line(tmp_path, capsys):
    plain = tmp_path / "train.parquet"
    pd.DataFrame({"prompt": [f"{i} + 1 = ?" for i in range(8)], "data_source": ["t"] * 8,
                  "reward_model": [{"ground_truth": str(i + 1)} for i in range(8)]}).to_parquet(plain)
    assert stapo_main(["check", OWN, "stapo.synthetic_data_dir=null", f"data.train_files={plain}",
                       f"data.val_files=[{plain}]"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"stapo: data.train_files={plain}: column prompt holds plain strings")


@pytest.mark.parametrize("count, batch, epochs", [(3, 4, 1), (3, 4, 5), (0 + 4, 4, 1), (9, 4, 2), (8, 8, 3)])
def test_fewer_rows_than_a_batch_are_refused_with_the_steps_unset_and_the_steps_are_counted(
        tmp_path, count, batch, epochs):
    """verl sizes a run with trainer.total_training_steps unset as total_epochs x (rows // batch): fewer rows than
    one batch train nothing, whatever the epochs."""
    train = write_rows(tmp_path / "train.parquet", rows(count))
    overrides = ["model_preset=tiny", OWN, "stapo.synthetic_data_dir=null", f"data.train_files={train}",
                 f"data.val_files=[{train}]", f"data.train_batch_size={batch}", f"trainer.total_epochs={epochs}",
                 "trainer.total_training_steps=null", "actor_rollout_ref.actor.ppo_mini_batch_size=1"]
    config = compose_run(overrides)
    expected = sum(1 for _ in range(epochs) for start in range(0, count - batch + 1, batch))  # drop_last batches
    if expected == 0:
        with pytest.raises(STAPOConfigError, match=f"hold {count} rows, fewer than one batch of data.train_batch_size"):
            check_inputs(config)
        return
    assert check_inputs(config)[-1].startswith(f"steps: {expected}, trainer.total_epochs={epochs} of ")
    assert planned_steps(config) == expected


@pytest.mark.parametrize("override, key", [("+trainer.total_epochs=2", "trainer.total_epochs"),
                                           ("+data.train_batch_size=8", "data.train_batch_size"),
                                           ("+algo=grpo", "algo"), ("+model_preset=qwen3_8b", "model_preset")])
def test_a_plus_for_a_key_that_exists_says_drop_the_plus_in_one_line(override, key):
    with pytest.raises(STAPOConfigError) as error:
        compose_run([override])
    message = str(error.value)
    assert message.startswith(f"+{key}=...: drop the + : {key} exists in the config") and "\n" not in message
    assert compose_run(["+trainer.a_new_key=1"]).trainer.a_new_key == 1  # a new key still takes its +


# ---------------------------------------------------------------- the CLI


def test_version_prints_the_package_and_verl_versions(capsys):
    import stapo

    for flag in ("--version", "-V"):
        assert stapo_main([flag]) == 0
        assert capsys.readouterr().out == f"stapo {stapo.__version__} (verl {version('verl')})\n"
    assert stapo.__version__ == version("stapo")
    assert stapo_main(["--help"]) == 0 and "--version" in capsys.readouterr().out


def test_stapo_train_is_a_command_and_refuses_before_starting_anything(tmp_path, monkeypatch, capsys):
    assert COMMANDS["train"][0] == "stapo.train_cli"
    assert stapo_main(["--help"]) == 0 and "\n  train " in capsys.readouterr().out
    assert stapo_main(["train", "--help"]) == 0 and "usage: stapo train [-v] [Hydra overrides...]" in \
        capsys.readouterr().out
    monkeypatch.chdir(tmp_path)
    for argv, start in [
        (["--cfg", "job"], "stapo: train: --cfg is not an option of stapo train"),
        ([f"{MODEL}=Qwen/Qwen2.5-7B"], "stapo: model_preset=tiny (the default preset"),
        (["trainer.total_training_stepz=3"], "stapo: trainer.total_training_stepz: not a key of trainer"),
        (["+trainer.total_epochs=2"], "stapo: +trainer.total_epochs=...: drop the +"),
    ]:
        assert stapo_main(["train", *argv]) == 2, argv
        (line,) = capsys.readouterr().err.splitlines()
        assert line.startswith(start), line
    assert not list(tmp_path.iterdir())  # no run folder, nothing started


# ---------------------------------------------------------------- the ETA counts validation


def _remaining_by_loop(step: int, total: int, test_freq: int, per_step: float, per_val: float) -> float:
    """verl's loop after ``step``, walked: each step, then a validation where trainer_base.fit runs one."""
    seconds = 0.0
    for later in range(step + 1, total + 1):
        seconds += per_step
        if test_freq > 0 and (later == total or later % test_freq == 0):
            seconds += per_val
    return seconds


def test_the_eta_counts_the_validations_left_at_their_measured_time():
    generator = random.Random(57)
    cases = [(0, 10, 5), (10, 10, 5), (9, 10, 20), (3, 10, -1), (3, 10, 0), (4, 12, 4), (7, 7, 1)]
    cases += [(generator.randint(0, 40), generator.randint(1, 40), generator.randint(-1, 15)) for _ in range(300)]
    for step, total, test_freq in cases:
        step = min(step, total)
        loop = sum(1 for later in range(step + 1, total + 1)
                   if test_freq > 0 and (later == total or later % test_freq == 0))
        assert validations_after(step, total, test_freq) == loop, (step, total, test_freq)
        step_times = [generator.uniform(0.5, 9.0) for _ in range(3)]
        val_times = [generator.uniform(5.0, 60.0) for _ in range(2)]
        progress = Progress(total, test_freq=test_freq)
        for seconds in step_times[:-1]:
            progress.line(1, {"timing_s/step": seconds})
        progress.line(1, {"timing_s/step": step_times[-1], "timing_s/testing": val_times[0]})
        progress.line(1, {"timing_s/testing": val_times[1]})
        expected = _remaining_by_loop(step, total, test_freq, sum(step_times) / 3, sum(val_times) / 2)
        seconds, untimed = progress.remaining(step)
        assert untimed == 0 and seconds == pytest.approx(expected, rel=1e-12, abs=1e-9)
        assert progress.eta(step) == format_duration(expected)


def test_before_a_validation_was_timed_the_eta_says_how_many_it_leaves_out():
    progress = Progress(total_steps=10, label="t", test_freq=5)
    line = progress.line(1, {"timing_s/step": 6.0})
    assert "ETA 54s + 2 validations" in line  # steps 5 and 10
    assert "ETA 30s + 1 validation |" in progress.line(5, {"timing_s/step": 6.0}) + " |"  # step 10's
    assert "ETA 36s" in Progress(10, test_freq=0).line(4, {"timing_s/step": 6.0})
    assert "step 3 |" in Progress(0, label="t").line(3, {"timing_s/step": 6.0})  # steps not known here
    assert "ETA unknown" in Progress(0).line(3, {"timing_s/step": 6.0})


def test_a_sweep_shows_its_overall_eta():
    clock = SweepClock(runs=4, parallel=1)
    first = clock.start(Progress(10, test_freq=0))
    assert clock.eta() == "after the first step"
    line = first.line(2, {"timing_s/step": 10.0})  # 80 s left; 3 runs waiting at (elapsed ~0 + 80 s) each
    assert line.endswith("| sweep ETA 5m20s")
    clock.finish(first, 120.0)
    second = clock.start(Progress(10, test_freq=0))
    second.line(5, {"timing_s/step": 4.0})  # 20 s left, then 2 runs at the finished run's 120 s
    assert clock.eta() == "4m20s"
    assert SweepClock(runs=4, parallel=2, finished_seconds=[100.0]).eta() == "2m30s"  # 3 x 100 s, 2 at once


def test_a_relative_file_path_means_the_file_here_at_every_front_door(tmp_path, monkeypatch):
    """The rule, the loss files and the reward alike: made absolute where the command is typed (a sweep's cells
    start in their run folders), said in a note; names, schemes and absolute paths are kept."""
    from stapo.check import absolute_file_overrides

    monkeypatch.chdir(tmp_path)
    given = ["stapo.custom_rule.path=rules/mine.py", "+stapo.custom_rule.path=/abs/mine.py",
             "reward.custom_reward_function.path=pkg://stapo.reward",
             "reward.custom_reward_function.path=file://my_reward.py", "stapo.import_files=[a.py, '/b.py']",
             "stapo.import_files=[/a.py, /b.py]", "stapo.custom_rule.path=null", "~stapo.custom_rule.path",
             "algo=stapo"]
    done, notes = absolute_file_overrides(given)
    assert done == [f"stapo.custom_rule.path={tmp_path}/rules/mine.py", given[1], given[2],
                    f"reward.custom_reward_function.path={tmp_path}/my_reward.py",
                    f"stapo.import_files=[{tmp_path}/a.py,/b.py]", *given[5:]]
    assert notes == [f"stapo.custom_rule.path: a relative path, taken from this folder as {tmp_path}/rules/mine.py",
                     (f"reward.custom_reward_function.path: a relative path, taken from this folder as "
                      f"{tmp_path}/my_reward.py"),
                     f"stapo.import_files: a relative path, taken from this folder as [{tmp_path}/a.py,/b.py]"]


def test_a_local_sweeps_cells_get_the_absolute_paths_the_pre_check_read(tmp_path, monkeypatch, capsys):
    from stapo.sweep.cli import absolute_paths
    from stapo.sweep.grid import parse_axis, plan

    monkeypatch.chdir(tmp_path)
    runs = plan([parse_axis("stapo.custom_rule.path=a.py,/abs/b.py")], [1], tmp_path / "out")
    common, planned = absolute_paths(["stapo.custom_rule.name=rule"], runs)
    assert common == ["stapo.custom_rule.name=rule"]
    assert [run.cell_overrides for run in planned] == [(f"stapo.custom_rule.path={tmp_path}/a.py",),
                                                       ("stapo.custom_rule.path=/abs/b.py",)]
    assert [(run.cell, run.run_dir) for run in planned] == [(run.cell, run.run_dir) for run in runs]
    assert capsys.readouterr().out == (f"[sweep] stapo.custom_rule.path: a relative path, taken from this folder as "
                                       f"{tmp_path}/a.py\n")


def test_an_exit_inside_the_recipes_run_is_one_line_and_no_finished_run(capsys):
    """``sys.exit(0)`` from inside the run (a user's file, a library) would read as a finished run: exit 1, one
    line naming where it was called; another exit code is kept."""
    from recipe.stapo.main_stapo import exited_early

    def user_code():
        sys.exit(0)

    try:
        user_code()
    except SystemExit as error:
        with pytest.raises(SystemExit) as ended:
            exited_early(error)
    assert ended.value.code == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("stapo: the run called sys.exit(0) at ") and f"{__file__}:" in line
    with pytest.raises(SystemExit) as kept:
        exited_early(SystemExit(3))
    assert kept.value.code == 3


def test_stapo_check_refuses_a_rule_that_exits_instead_of_ending_with_exit_0(tmp_path, capsys):
    rule = tmp_path / "exits.py"
    rule.write_text("import sys\n\n\ndef rule(response_mask, **_):\n    sys.exit(0)\n")
    assert stapo_main(["check", "--no-paths", "model_preset=tiny", f"stapo.custom_rule.path={rule}",
                       "stapo.custom_rule.name=rule"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"stapo: {rule}:5 (rule): raised on a synthetic batch of 8 x 32: SystemExit(0)")


def test_an_exit_through_wandbs_hook_names_the_callers_line(capsys):
    """Once wandb has started in the process, sys.exit is wandb's hook, which raises from its own file: the line
    named is the caller's, not the hook's."""
    from wandb.sdk.lib.exit_hooks import ExitHooks

    from recipe.stapo.main_stapo import exited_early

    hooks = ExitHooks()
    hooks._orig_exit = sys.exit

    def user_code():
        hooks.exit(0)

    try:
        user_code()
    except SystemExit as error:
        assert any(frame.filename.endswith("exit_hooks.py") for frame in traceback.extract_tb(error.__traceback__))
        with pytest.raises(SystemExit):
            exited_early(error)
    (line,) = capsys.readouterr().err.splitlines()
    assert f"{__file__}:" in line and "exit_hooks.py" not in line
