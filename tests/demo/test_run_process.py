"""The one runner of the recipe as a child process (demo, sweep, e2e tests, benchmark): lines, memory, limits.

The child is the real ``python -m recipe.stapo.main_stapo``; ``--cfg job`` makes it print the
composed config and exit before any preparation, so no Ray starts.
"""

from __future__ import annotations

import os

import pytest

from stapo.runs.process import run_recipe_process
from stapo.runs.train import run_trainer


@pytest.mark.slow  # starts processes: out of make test-fast
def test_lines_memory_and_ticks_of_a_real_recipe_process(tmp_path):
    lines, ticks = [], []
    run = run_recipe_process(
        ["logger=tensorboard", "--cfg", "job"], on_line=lambda line, proc: lines.append(line),
        on_tick=ticks.append, cwd=tmp_path,
    )
    assert run.returncode == 0 and not run.timed_out
    assert "  - tensorboard\n" in lines and run.peak_rss_bytes > 10 * 2**20  # it imported torch and verl
    assert ticks and ticks == sorted(ticks) and run.seconds >= ticks[-1]


def test_a_time_limit_kills_the_whole_session(tmp_path):
    run = run_recipe_process(["--cfg", "job"], timeout=0.6, cwd=tmp_path)
    assert run.timed_out and run.returncode != 0 and run.seconds < 30


@pytest.mark.slow  # starts processes: out of make test-fast
def test_a_failing_run_keeps_its_log_and_wandb_stays_offline(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    result = run_trainer(["no_such_group=1", "--cfg", "job"], tmp_path / "run", total_steps=2, label="t")
    log = result.log_path.read_text()
    assert result.returncode != 0 and log.startswith("$ ") and "no_such_group" in log
    assert "WANDB_MODE" not in os.environ  # the child's default never leaks into this process
