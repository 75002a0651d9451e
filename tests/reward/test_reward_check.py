"""The reward checked before Ray (stapo/verl_plugin/preflight/reward_check.py): each refusal, through verl 0.9.1's own
loader, on the shipped example's prepared rows; the expected lines, files and line numbers are written by hand."""

from __future__ import annotations

import pytest

from stapo.algorithm.validation import STAPOConfigError
from stapo.verl_plugin.preflight import reward_check
from stapo.verl_plugin.preflight.reward_check import check_reward, default_sources
from tests.reward.conftest import EXAMPLES, REPO

GOOD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    return float(solution_str.strip() == ground_truth)
"""


def refusal(config, paths: bool = True) -> str:
    with pytest.raises(STAPOConfigError) as caught:
        check_reward(config, paths=paths)
    return str(caught.value)


def test_the_shipped_example_scores_the_rows_own_answer_above_a_wrong_one(run_config, example_parquet):
    notes = check_reward(run_config(EXAMPLES / "my_reward.py"))
    assert len(notes) == 1, notes
    assert notes[0].startswith(f"reward: {EXAMPLES / 'my_reward.py'} (compute_score) tried on 3 row(s) of "
                               f"{example_parquet}: the row's own answer scores [1.0], a wrong one [0.0] (written in "
                               "\\boxed{}); ")
    assert " ms a call (12 calls)" in notes[0]  # per row: bare (0 vs 0), then boxed (1 vs 0)


def test_reward_kwargs_reach_the_calls(run_config):
    notes = check_reward(run_config(EXAMPLES / "my_reward.py", format_score=0.25))
    assert "a wrong one [0.25]" in notes[0], notes


def test_the_papers_reward_by_module(run_config):
    notes = check_reward(run_config("pkg://stapo.reward"))
    assert "the row's own answer scores [1.0], a wrong one [-1.0] (written in \\boxed{})" in notes[0], notes


def test_an_exact_match_reward_is_tried_bare_and_an_async_one_is_awaited(run_config, reward_file):
    notes = check_reward(run_config(reward_file(GOOD)))
    assert "scores [1.0], a wrong one [0.0] (written bare); " in notes[0] and "(6 calls)" in notes[0], notes
    path = reward_file("async def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                       "    return 2.0 if solution_str == ground_truth else -2.0\n", "async_reward.py")
    assert "scores [2.0], a wrong one [-2.0] (written bare)" in check_reward(run_config(path))[0]


def test_a_syntax_error_names_the_file_and_line(run_config, reward_file):
    path = reward_file("""
        def compute_score(data_source, solution_str, ground_truth, extra_info=None):
            score = 1.0
            if solution_str == ground_truth
                return score
            return 0.0
        """)
    assert refusal(run_config(path)) == (f"reward.custom_reward_function.path={path}: {path}:3: SyntaxError: "
                                         "expected ':' ('if solution_str == ground_truth')")


def test_a_missing_file_with_the_close_one(run_config, reward_file):
    path = reward_file(GOOD)
    missing = path.with_name("my_rewrd.py")
    assert refusal(run_config(missing)) == (f"reward.custom_reward_function.path={missing}: no such file "
                                            f"(did you mean '{path}'?)")
    assert refusal(run_config(path.parent)) == (f"reward.custom_reward_function.path={path.parent}: is a folder; "
                                                "give the reward's .py file")


def test_an_import_error_names_the_module_and_line(run_config, reward_file):
    path = reward_file("import math\nimport stapo_no_such_module\n" + GOOD)
    assert refusal(run_config(path)) == (
        f"reward.custom_reward_function.path={path}: importing it fails at {path}:2: no module named "
        "'stapo_no_such_module' (install it here and on every node)"
    )
    path = reward_file("TABLE = {}\n\nLIMIT = 1 / len(TABLE)\n" + GOOD, "top_level.py")
    assert refusal(run_config(path)) == (f"reward.custom_reward_function.path={path}: importing it raises "
                                         f"ZeroDivisionError: division by zero at {path}:3")


def test_a_missing_name_lists_the_files_functions(run_config, reward_file):
    path = reward_file(GOOD.replace("compute_score", "compute_scores") + "\ndef _private():\n    pass\n\n"
                       "def helper():\n    pass\n")
    assert refusal(run_config(path)) == (
        f"reward.custom_reward_function.name=compute_score: {path} has no 'compute_score'; its functions: "
        "['compute_scores', 'helper'] (did you mean 'compute_scores'?)"
    )
    assert "name the function" in refusal(run_config(path, name=None))
    path = reward_file("compute_score = 1.0\n", "not_callable.py")
    assert refusal(run_config(path)).endswith("'compute_score' is a float, not a function")


@pytest.mark.parametrize("definition, why", [
    ("def compute_score(prompt, response, answer):", "missing a required argument: 'prompt'"),
    ("def compute_score(data_source, solution_str, ground_truth):", "got an unexpected keyword argument 'extra_info'"),
    ("def compute_score(data_source, solution_str, ground_truth, extra_info, /):",
     "'data_source' parameter is positional only, but was passed as a keyword"),
])
def test_a_signature_verl_cannot_call(run_config, reward_file, definition, why):
    path = reward_file(f"# a reward\n\n{definition}\n    return 1.0\n")
    signature = definition.removeprefix("def compute_score").removesuffix(":")
    assert refusal(run_config(path)) == (
        "reward.custom_reward_function.name=compute_score: verl calls compute_score(data_source=..., "
        f"solution_str=..., ground_truth=..., extra_info=...) by keyword, which {path}:3 compute_score{signature} "
        f"cannot take: {why}"
    )


def test_a_reward_kwarg_the_function_does_not_take(run_config, reward_file):
    path = reward_file("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 1\n")
    assert refusal(run_config(path, format_score=0.1)).endswith(
        "extra_info=..., format_score=...) by keyword, which "
        f"{path}:1 compute_score(data_source, solution_str, ground_truth, extra_info=None) cannot take: got an "
        "unexpected keyword argument 'format_score'"
    )


def test_an_exception_on_a_row_names_the_raise_and_the_row(run_config, reward_file, example_parquet):
    path = reward_file("""
        def parse(text):
            if text == "72":
                raise ValueError("cannot read " + text)
            return text


        def compute_score(data_source, solution_str, ground_truth, extra_info=None):
            return float(solution_str == parse(ground_truth))
        """)
    assert refusal(run_config(path)) == (
        f"reward.custom_reward_function: compute_score raised ValueError: cannot read 72 at {path}:3 on row 2 of "
        f"{example_parquet} (data_source='my_task', ground_truth='72', reply '72')"
    )


@pytest.mark.parametrize("returned, why", [
    ("float('nan')", "returned nan: a score must be finite"),
    ("{'score': float('-inf'), 'acc': 0.0}", "returned -inf: a score must be finite"),
    ("{'acc': 1.0}", "returned a dict without a 'score' key (keys ['acc'])"),
    ("'1.0'", "returned '1.0', not a number"),
    ("None", "returned None, not a number"),
    ("[1.0]", "returned [1.0] (list), not a number"),
])
def test_a_score_verl_cannot_use(run_config, reward_file, example_parquet, returned, why):
    path = reward_file(f"def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                       f"    return {returned}\n")
    message = refusal(run_config(path))
    assert message.startswith(f"reward.custom_reward_function: compute_score {why}"), message
    assert message.endswith(f"on row 1 of {example_parquet} (data_source='my_task', ground_truth='42', reply '42')")


def test_numbers_verl_takes_are_accepted(run_config, reward_file):
    import numpy as np  # noqa: F401  (the reward file imports it)

    path = reward_file("import numpy as np\n\ndef compute_score(data_source, solution_str, ground_truth, "
                       "extra_info=None):\n    return np.float32(solution_str == ground_truth)\n")
    assert "scores [1.0], a wrong one [0.0]" in check_reward(run_config(path))[0]
    path = reward_file("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                       "    return solution_str == ground_truth\n", "boolean.py")
    assert "scores [1.0], a wrong one [0.0]" in check_reward(run_config(path))[0]


@pytest.mark.parametrize("given", ["recipe/stapo/examples/my_reward.py", "file://recipe/stapo/examples/my_reward.py",
                                   "./recipe/stapo/examples/my_reward.py"])
def test_a_relative_path_is_refused_with_the_absolute_one(run_config, monkeypatch, given):
    monkeypatch.chdir(REPO)
    expected = (f"reward.custom_reward_function.path={given}: a relative path; verl opens it from each Ray worker's "
                "own directory (another node's, a sweep's run folder), not this one: give the absolute path, here "
                f"{REPO / 'recipe/stapo/examples/my_reward.py'}")
    assert refusal(run_config(given)) == expected
    assert refusal(run_config(given), paths=False) == expected  # a setting, not a file: refused without paths too


def test_a_home_path_is_refused_verl_does_not_expand_it(run_config, monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert refusal(run_config("~/my_reward.py")).endswith(
        f"give the absolute path, here {tmp_path / 'my_reward.py'} (no such file there either)")


def test_a_module_that_does_not_import(run_config):
    assert refusal(run_config("pkg://stapo.no_such_reward")) == (
        "reward.custom_reward_function.path=pkg://stapo.no_such_reward: no module stapo.no_such_reward is importable "
        "here (pkg:// names an installed module, e.g. pkg://stapo.reward)")


def test_a_reward_that_scores_nothing_apart_is_a_warning(run_config, reward_file):
    path = reward_file("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                       "    return {'score': 0.5, 'acc': 0.0}\n")
    notes = check_reward(run_config(path))
    assert len(notes) == 2 and "(18 calls)" in notes[0], notes  # 3 rows x 3 formats x (right, wrong)
    assert notes[1].startswith("reward: warning: compute_score never scored a row's own answer above a wrong one "
                               "('42'=0.5, '43'=0.5, 'The answer is \\\\boxed{42}.'=0.5")
    assert f"`stapo reward test {path} --data " in notes[1]


def test_a_reward_that_hangs_is_refused(run_config, reward_file, monkeypatch):
    monkeypatch.setattr(reward_check, "CALL_TIMEOUT_S", 0.2)
    path = reward_file("import time\n\ndef compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                       "    time.sleep(3)\n    return 1.0\n")
    assert "compute_score did not return within 0.2 s on row 1 of" in refusal(run_config(path))


def test_paths_not_checked_leave_the_file_unread(run_config, reward_file, monkeypatch):
    broken = reward_file("def compute_score(:\n")
    assert check_reward(run_config(broken), paths=False) == [f"reward: {broken} not loaded (--no-paths)"]
    monkeypatch.setenv("STAPO_SKIP_PATH_CHECKS", "1")
    assert check_reward(run_config(broken)) == [f"reward: {broken} not loaded (STAPO_SKIP_PATH_CHECKS=1)"]


def test_a_training_file_the_recipe_writes_later(run_config, reward_file, tmp_path):
    notes = check_reward(run_config(reward_file(GOOD), data=tmp_path / "later" / "train.parquet"))
    assert notes[0].endswith("loaded, its signature fits; not tried on rows: "
                             f"{tmp_path / 'later' / 'train.parquet'} does not exist yet (the recipe writes it at "
                             "launch)")


def test_a_reward_model_is_called_with_its_router(run_config, reward_file):
    config = run_config(reward_file(GOOD.replace(", **kwargs", "")))
    config.reward.reward_model.enable = True
    assert "cannot take: got an unexpected keyword argument 'reward_router_address'" in refusal(config)
    config = run_config(reward_file(GOOD, "with_kwargs.py"))
    config.reward.reward_model.enable = True
    assert check_reward(config)[0].endswith("its signature fits; not called (a reward model's server scores with it "
                                            "on the cluster)")


# --------------------------------------------------------------------------- no custom reward: verl's default


def test_the_data_sources_read_from_verl_are_the_ones_it_scores():
    """Independent of the reading: verl's default_compute_score itself, called on each, raises NotImplementedError
    only for a data_source not read (the code sources, which run a sandbox, are only looked up)."""
    from verl.utils.reward_score import default_compute_score

    names, prefixes = default_sources()
    assert {"openai/gsm8k", "lighteval/MATH", "math_dapo", "codecontests", "searchR1_nq"} <= names
    assert prefixes == ("aime",)
    for name in sorted(names - {"codecontests", "apps", "codeforces", "taco"}) + ["aime2030"]:
        try:
            default_compute_score(name, "#### 4 \\boxed{4}", "4")
        except NotImplementedError:
            pytest.fail(f"{name} was read as known but verl does not score it")
        except Exception:  # noqa: BLE001  a scorer's own dependency missing here: still not NotImplementedError
            pass
    with pytest.raises(NotImplementedError):
        default_compute_score("my_task", "4", "4")


def test_without_a_custom_reward_the_data_sources_are_checked(run_config, example_parquet, tmp_path):
    message = refusal(run_config(None))
    assert message.startswith(f"data.train_files={example_parquet}: data_source ['my_task'] is not one verl's "
                              "default_compute_score scores (reward.custom_reward_function.path is unset); give your "
                              "reward with reward.custom_reward_function.path=/abs/file.py, or one of [")
    import pyarrow.parquet as pq

    table = pq.read_table(example_parquet).to_pandas()
    table["data_source"] = "openai/gsm8k"
    gsm8k = tmp_path / "gsm8k.parquet"
    table.to_parquet(gsm8k)
    assert check_reward(run_config(None, data=gsm8k)) == [
        "reward: verl's default_compute_score, which scores the data's data_source ['openai/gsm8k']"]
    assert check_reward(run_config(None), paths=False) == [
        "reward: verl's default_compute_score; data_source values not checked (--no-paths)"]


def test_stapo_check_runs_it_after_the_data_checks(example_parquet, reward_file, capsys):
    """`stapo check` (check_run, also run by `stapo train`): its note among the others, or its one line and exit 2;
    on the CPU preset with the example's data (no GPU preset's device checks involved)."""
    from stapo.cli import main as stapo_main

    base = ["check", "model_preset=tiny", "stapo.cpu_preset.allow_other_inputs=true",
            f"data.train_files={example_parquet}", f"data.val_files={example_parquet}",
            "trainer.total_training_steps=2"]
    assert stapo_main([*base, f"reward.custom_reward_function.path={EXAMPLES / 'my_reward.py'}"]) == 0
    out = capsys.readouterr().out.splitlines()
    data_note = out.index(f"[stapo] data.train_files: {example_parquet}, parquet, 8 rows")
    reward_note = next(i for i, line in enumerate(out) if line.startswith("[stapo] reward: ") and "tried on" in line)
    assert reward_note > data_note and "own answer scores [1.0], a wrong one [0.0]" in out[reward_note]
    broken = reward_file("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                         "    return {'score': 1.0 if solution_str == ground_truth else 0.0\n")
    assert stapo_main([*base, f"reward.custom_reward_function.path={broken}"]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"stapo: reward.custom_reward_function.path={broken}: {broken}:2: SyntaxError: '{{' was never closed "
        "(\"return {'score': 1.0 if solution_str == ground_truth else 0.0\")")


def test_an_exit_in_the_reward_is_a_refusal_naming_the_line(run_config, reward_file, example_parquet):
    """``SystemExit`` is no ``Exception``: unrefused, `stapo check` and the recipe would end with exit 0 unsaid."""
    path = reward_file("import sys\n\ndef compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                       "    sys.exit(0)\n")
    assert refusal(run_config(path)) == (
        f"reward.custom_reward_function: compute_score called sys.exit(0) at {path}:4 on row 1 of {example_parquet} "
        "(data_source='my_task', ground_truth='42', reply '42')"
    )
    at_import = reward_file("import sys\nsys.exit(0)\n", "exits.py")
    assert refusal(run_config(at_import)).endswith(f"importing it calls sys.exit(0) at {at_import}:2: a reward must "
                                                   "return, not exit")


def test_each_call_is_one_line_and_the_calls_have_a_budget(run_config, reward_file, monkeypatch, capsys):
    notes = check_reward(run_config(EXAMPLES / "my_reward.py"))
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("[stapo] reward call 1: row 1, right answer, bare -> 0 (")
    assert len(lines) == len([line for line in lines if line.startswith("[stapo] reward call ")]) > 1
    assert f"({len(lines)} calls)" in notes[0]
    path = reward_file("import time\n\ndef compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                       "    time.sleep(0.15)\n    return 1.0\n")
    config = run_config(path)
    config.stapo.reward_check_budget_s = 0.4
    assert refusal(config).startswith(
        "reward.custom_reward_function: compute_score's calls took more than stapo.reward_check_budget_s=0.4 s (2 "
        "call(s) returned, the next on row 1 of")
    config.stapo.reward_check_budget_s = 0
    assert refusal(config) == "stapo.reward_check_budget_s must be a number of seconds > 0, got 0"


def test_stapo_check_refuses_a_reward_that_exits(example_parquet, reward_file, capsys):
    from stapo.cli import main as stapo_main

    path = reward_file("import sys\n\ndef compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                       "    sys.exit(0)\n")
    assert stapo_main(["check", "model_preset=tiny", "stapo.cpu_preset.allow_other_inputs=true",
                       f"data.train_files={example_parquet}", f"data.val_files={example_parquet}",
                       "trainer.total_training_steps=2", f"reward.custom_reward_function.path={path}"]) == 2
    assert capsys.readouterr().err.splitlines()[-1].startswith(
        f"stapo: reward.custom_reward_function: compute_score called sys.exit(0) at {path}:4 on row 1 of")
