"""`stapo reward test` (stapo/reward/cli.py): the README's command run as a user runs it, after the README's own
`stapo data prepare custom`, its output compared line by line with one written by hand (the times masked)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from stapo.cli import main as stapo_main
from tests.reward.conftest import EXAMPLES, REPO

README = REPO / "README.md"
MS = re.compile(r"\d+\.\d\d ms")


def readme_command(start: str, home: Path) -> list[str]:
    """README.md's command beginning with ``start``, continuations joined, ``$HOME`` as the shell expands it."""
    text = README.read_text(encoding="utf-8")
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.DOTALL):
        for line in block.replace("\\\n", " ").splitlines():
            if line.strip().startswith(start):
                return shlex.split(line.replace("$HOME", str(home)).replace("~/", f"{home}/"))
    raise AssertionError(f"no command starting {start!r} in {README}")


def run(argv: list[str], capsys) -> tuple[int, list[str], str]:
    code = stapo_main(argv)
    captured = capsys.readouterr()
    return code, MS.sub("T ms", captured.out).splitlines(), captured.err


def test_the_readmes_command_prints_each_call(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    assert stapo_main(readme_command("stapo data prepare custom", tmp_path)[1:]) == 0
    command = readme_command("stapo reward test", tmp_path)
    capsys.readouterr()
    code, out, err = run(command[1:], capsys)
    data = tmp_path / "data" / "my_task" / "train.parquet"
    reward = REPO / "recipe" / "stapo" / "examples" / "my_reward.py"
    header = [
        f"[reward] recipe/stapo/examples/my_reward.py taken as {reward} (the current directory); a run needs the "
        "absolute path",
        f"[reward] {reward} (compute_score) on the first 3 row(s) of {data}",
    ]
    rows = []
    for number, (question, answer, wrong) in enumerate([("What is 17 + 25?", "42", "43"),
                                                        ("What is 9 times 8?", "72", "73"),
                                                        ("What is 100 - 37?", "63", "64")], start=1):
        rows += [
            f"row {number}: data_source 'my_task', prompt 'Put the final answer in \\\\boxed{{}}. {question}'",
            f"  ground truth: '{answer}'",
            f"  score 0 {{'acc': 0.0}} in T ms: '{answer}' (the ground truth, bare)",
            f"  score 0 {{'acc': 0.0}} in T ms: '{wrong}' (a wrong answer, bare)",
            f"  score 1 {{'acc': 1.0}} in T ms: 'The answer is \\\\boxed{{{answer}}}.' (the ground truth, "
            "in \\boxed{})",
            f"  score 0 {{'acc': 0.0}} in T ms: 'The answer is \\\\boxed{{{wrong}}}.' (a wrong answer, in \\boxed{{}})",
        ]
    summary = [f"[reward] {reward} (compute_score) tried on 3 row(s) of {data}: the row's own answer scores [1.0], a "
               "wrong one [0.0] (written in \\boxed{}); T ms a call (12 calls)"]
    assert (code, err) == (0, "")
    assert out == header + rows + summary


def test_a_given_response_on_every_row(example_parquet, capsys):
    code, out, _ = run(["reward", "test", str(EXAMPLES / "my_reward.py"), "--data", str(example_parquet), "--rows",
                        "2", "--response", "\\boxed{72}", "--response", "72"], capsys)
    assert code == 0
    assert [line for line in out if line.startswith("  score")] == [
        "  score 0 {'acc': 0.0} in T ms: '\\\\boxed{72}' (given)",
        "  score 0 {'acc': 0.0} in T ms: '72' (given)",
        "  score 1 {'acc': 1.0} in T ms: '\\\\boxed{72}' (given)",
        "  score 0 {'acc': 0.0} in T ms: '72' (given)",
    ]
    assert out[-1] == (f"[reward] {EXAMPLES / 'my_reward.py'} (compute_score) tried on 2 row(s) of {example_parquet}; "
                       "T ms a call (4 calls)")


def test_a_reward_that_fails_is_the_checks_one_line(example_parquet, reward_file, capsys):
    path = reward_file("def score(data_source, solution_str, ground_truth, extra_info=None):\n"
                       "    return 1 / 0\n")
    code, out, err = run(["reward", "test", str(path), "--name", "score", "--data", str(example_parquet)], capsys)
    assert (code, out) == (2, [f"[reward] {path} (score) on the first 3 row(s) of {example_parquet}"])
    assert err == (f"stapo: reward.custom_reward_function: score raised ZeroDivisionError: division by zero at "
                   f"{path}:2 on row 1 of {example_parquet} (data_source='my_task', ground_truth='42', reply '42')\n")
    code, _, err = run(["reward", "test", str(path), "--data", str(example_parquet)], capsys)
    assert code == 2 and err.startswith(f"stapo: reward.custom_reward_function.name=compute_score: {path} has no "
                                        "'compute_score'; its functions: ['score']")


@pytest.mark.parametrize("args, line", [
    (["--rows", "0"], "stapo: --rows=0: give 1 or more"),
    (["--data", "/no/such.parquet"], "stapo: --data=/no/such.parquet: no such file"),
])
def test_bad_arguments(example_parquet, capsys, args, line):
    argv = ["reward", "test", str(EXAMPLES / "my_reward.py"), "--data", str(example_parquet), *args]
    code, _, err = run(argv, capsys)
    assert (code, err) == (2, line + "\n")


def test_the_command_is_listed(capsys):
    assert stapo_main(["--help"]) == 0
    assert "  reward   `reward test FILE --data F`" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        stapo_main(["reward", "test", "--help"])
    assert "--response TEXT" in capsys.readouterr().out


def test_the_calls_before_a_failure_are_shown(example_parquet, reward_file, capsys):
    path = reward_file("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                       "    assert ground_truth != '72', 'no 72'\n    return float(solution_str == ground_truth)\n")
    code, out, err = run(["reward", "test", str(path), "--data", str(example_parquet)], capsys)
    assert code == 2 and out[1:] == ["row 1: data_source 'my_task', prompt 'Put the final answer in \\\\boxed{}. What "
                                     "is 17 + 25?'", "  ground truth: '42'", "  score 1 in T ms: '42' (the ground "
                                     "truth, bare)", "  score 0 in T ms: '43' (a wrong answer, bare)"]
    assert err.startswith("stapo: reward.custom_reward_function: compute_score raised AssertionError: no 72 at "
                          f"{path}:2 on row 2 of")
