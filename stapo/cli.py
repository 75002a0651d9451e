"""`stapo` command line: one entry point, each sub-command implemented by its own module.

Every sub-command module exposes ``main(argv: list[str]) -> int``; this file only dispatches,
so importing it stays cheap (no torch / verl import until a command runs).
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
import threading

COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("stapo.train_cli", "the recipe (python -m recipe.stapo.main_stapo, same overrides) on any device, one "
              "progress line a step with an ETA"),
    "demo": ("stapo.demo.cli", "train a real small model with STAPO on CPU, with progress and plots"),
    "plot": ("stapo.runs.plot", "draw reward / entropy / mask-ratio plots from run folders, grouped with seed bands"),
    "sweep": ("stapo.sweep.cli", "run a grid of overrides x seeds, one run folder each, and compare them"),
    "compare": ("stapo.runs.compare_cli", "the comparison a sweep writes, over any run folders (e.g. from two sets)"),
    "data": ("stapo.data.cli", "the paper's data sets, or your own file (`custom`), in verl's parquet format"),
    "eval": ("stapo.eval.cli", "avg@N evaluation of a checkpoint on the paper's benchmarks"),
    "export": ("stapo.export", "a saved checkpoint step as a Hugging Face model folder with a model card"),
    "check": ("stapo.check", "compose the recipe's config from overrides and run every check a run makes before Ray"),
    "reward": ("stapo.reward.cli", "`reward test FILE --data F`: try a reward function on a data file's rows by hand"),
    "doctor": ("stapo.doctor", "preflight checks of a Ray cluster (--smoke: a 2-step GPU run) before a big job"),
}


# the commands that run trainers as children in sessions of their own (stapo/runs/process.py)
STARTS_TRAINERS = {"demo", "sweep", "train"}


def _usage() -> str:
    lines = ["usage: stapo <command> [options]", "", "commands:"]
    lines += [f"  {name:<8} {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "`stapo <command> --help` describes each command's options;",
              "`stapo --version` (-V) prints the version."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in {"-h", "--help", "help"}:
        print(_usage())
        return 0
    if argv[0] in {"-V", "--version"}:
        print(version_line())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"stapo: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    from stapo.algorithm.validation import STAPOConfigError, refusal_line

    module = importlib.import_module(COMMANDS[name][0])
    previous = _stop_on_sigterm() if name in STARTS_TRAINERS else None
    try:
        return int(module.main(rest) or 0)
    except STAPOConfigError as error:  # a bad setting is the user's to fix: one line, no traceback
        if os.environ.get("STAPO_DEBUG") == "1":
            raise
        print(refusal_line(error), file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # no traceback; a command that started trainers has said what it stopped and kept
        return 130
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def version_line() -> str:
    """``stapo 0.1.0 (verl 0.9.1)``: this package's version and the verl it runs on, read from the installed
    packages' metadata (nothing imported)."""
    from importlib.metadata import PackageNotFoundError, version

    import stapo

    try:
        verl = f" (verl {version('verl')})"
    except PackageNotFoundError:
        verl = " (verl not installed)"
    return f"stapo {stapo.__version__}{verl}"


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def _stop_on_sigterm():
    """SIGTERM (``kill``, a scheduler cancelling the job) handled as Ctrl-C: the commands that start trainers run
    them in sessions of their own, which a SIGTERM to this process alone would leave running; on Ctrl-C they stop
    them. The other commands keep the default (an immediate exit). The handler it replaces, to put back (None off
    the main thread, where none can be installed)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, _interrupt)


if __name__ == "__main__":
    raise SystemExit(main())
