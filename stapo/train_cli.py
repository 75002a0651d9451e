"""`stapo train [Hydra overrides...]`: the recipe, as ``python -m recipe.stapo.main_stapo`` runs it, with one
progress line a step.

The same overrides, config and checks, on any device (the GPU presets as the CPU ones). Before the run
starts, the config is composed and checked as ``stapo check`` does, model and data paths included (a
refusal is one line, exit 2), and its resolved summary is printed (preset, device, model, batch, steps,
rollout, reward). The recipe then runs as a child process in this folder: its whole output goes to
``RUN_DIR/trainer.log`` (``-v`` also prints it), and the console gets one line a step, read from the run
folder's ``metrics.jsonl`` as ``stapo demo`` reads it: reward, accuracy, entropy, mask ratio, s/step and an
ETA that counts the validations still to come.

``RUN_DIR`` is ``stapo.run_dir``; when the overrides do not set it, ``runs/train-<time>`` here (printed). On a
cluster it must be on storage that the node running verl's trainer writes and this machine reads (the
trainer's file logger writes ``metrics.jsonl`` there). The exit status is the recipe's. wandb stays offline
unless ``WANDB_MODE`` is set (``WANDB_MODE=online`` uploads), as for every run of this project.
"""

from __future__ import annotations

import time
from pathlib import Path

from stapo.algorithm.validation import STAPOConfigError

LOG_TAIL_LINES = 40
OPTIONS = {"-v": "verbose", "--verbose": "verbose", "-h": "help", "--help": "help"}


def parse(argv: list[str]) -> tuple[set[str], list[str]]:
    """(options given, overrides): every argument that is not one of this command's options is a Hydra override;
    another flag is refused (Hydra's own flags, such as ``--cfg job``, belong to ``python -m
    recipe.stapo.main_stapo``)."""
    options, overrides = set(), []
    for arg in argv:
        if arg in OPTIONS:
            options.add(OPTIONS[arg])
        elif arg.startswith("-") and not arg.startswith(("~", "+")):
            raise STAPOConfigError(
                f"train: {arg} is not an option of stapo train (-v/--verbose, -h/--help); everything else is a Hydra "
                "override key=value (Hydra's own flags: python -m recipe.stapo.main_stapo)"
            )
        else:
            overrides.append(arg)
    return options, overrides


def run_folder(config, overrides: list[str]) -> tuple[Path, list[str]]:
    """The run folder (``stapo.run_dir``, or a new ``runs/train-<time>``) and the overrides that name it."""
    from omegaconf import OmegaConf, open_dict

    given = OmegaConf.select(config, "stapo.run_dir", default=None)
    if given:
        return Path(str(given)).expanduser(), overrides
    folder = (Path("runs") / time.strftime("train-%Y%m%d-%H%M%S")).resolve()
    with open_dict(config):
        config.stapo.run_dir = str(folder)
    return folder, [*overrides, f"stapo.run_dir={folder}"]


def main(argv: list[str]) -> int:
    from stapo.check import (
        absolute_file_overrides,
        check_run,
        compose_run,
        composed_choices,
        quiet_optional_engines,
        run_summary,
    )

    quiet_optional_engines()  # the checks import verl
    options, overrides = parse(argv)
    if "help" in options:
        print(f"usage: stapo train [-v] [Hydra overrides...]\n\n{__doc__}")
        return 0
    overrides, path_notes = absolute_file_overrides(overrides)  # the recipe runs in this folder; said all the same
    for note in path_notes:
        print(f"[stapo] {note}", flush=True)
    config = compose_run(overrides)
    choices = composed_choices()
    run_dir, overrides = run_folder(config, overrides)
    for note in check_run(config, paths=True, launch=True):  # a GPU run on a machine without one: refused here
        print(f"[stapo] {note}", flush=True)
    for line in run_summary(config, choices):
        print(f"[stapo] {line}", flush=True)

    from stapo.runs.progress import format_duration
    from stapo.runs.train import progress_plan, run_trainer

    steps, test_freq = progress_plan(config)
    print(f"[train] run folder {run_dir}: the trainer's whole output goes to {run_dir / 'trainer.log'}", flush=True)
    result = run_trainer(overrides, run_dir, steps, choices.get("algo", "train"), "verbose" in options,
                         test_freq=test_freq, cwd=Path.cwd())
    if result.returncode != 0:
        lines = result.log_path.read_text(encoding="utf-8", errors="replace").splitlines(True)[-LOG_TAIL_LINES:]
        print("".join(lines), end="", flush=True)
        print(f"[train] the run failed (exit {result.returncode}) after {format_duration(result.seconds)}; its "
              f"whole output: {result.log_path}", flush=True)
        return result.returncode
    print(f"[train] done in {format_duration(result.seconds)}; run folder {run_dir} (`stapo plot {run_dir}` draws "
          "its curves)", flush=True)
    return 0
