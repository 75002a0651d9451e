"""`stapo reward test FILE --data train.parquet`: a reward function tried by hand on a data file's own rows.

The function is loaded by verl's own loader and called with the keywords verl's reward manager passes, as
``stapo check`` does before a run (stapo/verl_plugin/preflight/reward_check.py); each call is printed with the row's
prompt, its ground truth, the reply tried, the score (and a dict's other values) and the call's time. With no
``--response``, each row is tried with its own answer and a wrong one, bare, in ``\\boxed{}`` and after ``####``
(stapo/reward/trial.py), until the right one scores higher. A failure is the one line ``stapo check`` prints.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from stapo.algorithm.validation import STAPOConfigError

DEFAULT_ROWS = 3


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="stapo reward", description="Try a reward function (verl's custom-reward "
                                  "hook) on a data file's rows before a run.")
    commands = top.add_subparsers(dest="command", metavar="{test}")
    test = commands.add_parser(
        "test", prog="stapo reward test",
        help="call a reward on rows of a data file and print each score and the time a call takes",
        description="Load FILE's function as verl does (reward.custom_reward_function.path / .name), call it on the "
        "first rows of --data as verl's reward manager does, and print each row's prompt, ground truth, the "
        "reply tried, the score and the time a call takes. Exit 0, or 2 with one line when it fails.",
    )
    test.add_argument("file", metavar="FILE", help="the reward's .py file (as reward.custom_reward_function.path), "
                      "or pkg://MODULE")
    test.add_argument("--name", default="compute_score", metavar="FN",
                      help="the function (reward.custom_reward_function.name; default compute_score)")
    test.add_argument("--data", required=True, metavar="FILE",
                      help="a prepared data file (parquet, JSON lines or JSON, as `stapo data prepare` writes)")
    test.add_argument("--rows", type=int, default=DEFAULT_ROWS, metavar="N",
                      help=f"how many of its first rows to try (default {DEFAULT_ROWS})")
    test.add_argument("--response", action="append", metavar="TEXT",
                      help="a reply to score on every row (repeatable); default: the row's own answer and a wrong "
                      "one")
    return top


def main(argv: list[str]) -> int:
    from stapo.check import quiet_optional_engines

    quiet_optional_engines()
    args = parser().parse_args(argv)
    if args.command != "test":
        parser().print_help()
        return 0 if args.command is None else 2
    return test(args.file, args.name, args.data, args.rows, args.response)


def test(file: str, name: str, data: str, rows: int, responses: list[str] | None) -> int:
    from stapo.reward.trial import ground_truth, one_line, prompt_text, read_rows
    from stapo.verl_plugin.preflight.reward_check import (
        FILE,
        PKG,
        check_signature,
        load_reward,
        trial_notes,
        try_rows,
    )

    if rows < 1:
        raise STAPOConfigError(f"--rows={rows}: give 1 or more")
    path = file
    if not file.startswith(PKG):
        local = Path(file[len(FILE):] if file.startswith(FILE) else file).expanduser()
        if not local.is_absolute():
            print(f"[reward] {file} taken as {local.absolute()} (the current directory); a run needs the absolute "
                  "path")
        path = str(local.absolute())
    table = Path(data).expanduser()
    if not table.is_file():
        raise STAPOConfigError(f"--data={data}: no such file")
    if table.suffix not in (".parquet", ".jsonl", ".json"):
        raise STAPOConfigError(f"--data={data}: must be one of verl's data formats ['.parquet', '.json', '.jsonl']")
    reward = load_reward(path, name)
    check_signature(reward)
    chosen = read_rows(table, rows)
    if not chosen:
        raise STAPOConfigError(f"--data={data}: has no rows")
    print(f"[reward] {reward.label} on the first {len(chosen)} row(s) of {data}")
    shown = [0]

    def show(trial) -> None:
        if trial.row_number != shown[0]:
            shown[0] = trial.row_number
            print(f"row {shown[0]}: data_source {trial.row.get('data_source')!r}, prompt "
                  f"{one_line(repr(prompt_text(trial.row)), 90)}")
            print(f"  ground truth: {one_line(repr(ground_truth(trial.row)), 90)}")
        extra = {key: value for key, value in trial.result.items() if key != "score"} \
            if isinstance(trial.result, dict) else {}
        print(f"  score {trial.score:g}{f' {extra}' if extra else ''} in {1000 * trial.seconds:.2f} ms: "
              f"{one_line(repr(trial.reply.text), 70)} ({trial.reply.label})", flush=True)

    trials = try_rows(reward, chosen, str(data), responses, on_trial=show)
    for note in trial_notes(reward, trials, str(data)):
        print(f"[reward] {note.removeprefix('reward: ')}")
    return 0
