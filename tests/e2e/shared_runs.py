"""Trainer runs shared by the whole suite: each distinct configuration of the tiny CPU trainer runs once.

A pytest plugin (loaded from tests/conftest.py). Each fixture is session-scoped: the first test that
asks for it starts the real trainer (``tests.e2e.cpu_runs.run_recipe``: Ray on loopback, verl's
trainer, FSDP2 over gloo, the HF rollout), every later test reads the same run folder. A fixture
does not assert: it returns the finished run (its exit code, log, parsed step metrics, peak memory)
and the folders it wrote, and each test asserts what it proves on it. A run that fails is not
started again: pytest keeps the fixture's result for the session, failure included.

Time: the run's seconds count against the first test that asks for it (pytest-timeout covers fixture
set-up), so each module that uses one keeps a timeout of at least ``RUN_TIMEOUT_S`` plus its own runs.
Every run of ``launch`` on the HF server joins one Ray head per pytest process instead of starting Ray
(``tests.e2e.cpu_runs.session_ray``, stopped by ``pytest_sessionfinish`` below): the same numbers, about
a sixth less CPU a run (docs/testing.md, "Where a launch's time goes").

Where two configurations differed only in a setting no assertion reads (a rollout dump, a run
folder, a checkpoint frequency, 2 vs 4 steps), they are one run here; the docstring of each fixture
names its users. One run is started as a user starts it, through `stapo train` in a fresh interpreter
(``train_cli``), so the command's own checks read the same run as the recipe's.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from stapo.runs.process import STOP_GRACE_S
from tests.e2e.cpu_runs import JOIN, Run, logged_steps, run_recipe, session_ray, stop_session_ray

RUN_TIMEOUT_S = 600
# the fixtures below, by name: the modules that read them run on one pytest-xdist worker (tests/parallel.py)
SHARED_RUN_FIXTURES = frozenset({"stapo_run", "grpo_run", "entropy20_run", "stapo_two_ranks_run",
                                 "silent_stapo_train_run"})

# algo=stapo, 4 steps, a checkpoint every 2 steps, the run folder and verl's rollout dump
STAPO = [
    "algo=stapo",
    "trainer.total_training_steps=4",
    "trainer.save_freq=2",
]
# algo=grpo, 2 steps, no checkpoint, the rollout dump; without the tiny preset's STAPO_CPU_BACKEND
# (trainer.device=cpu on a machine without CUDA is enough: the driver turns the back-end on itself)
GRPO = [
    "algo=grpo",
    "trainer.total_training_steps=2",
    "trainer.save_freq=-1",
    "~ray_kwargs.ray_init.runtime_env.env_vars.STAPO_CPU_BACKEND",
]
# algo=entropy20, 2 steps, the checkpoint of step 2
ENTROPY20 = [
    "algo=entropy20",
    "trainer.total_training_steps=2",
    "trainer.save_freq=2",
]
# algo=stapo on two FSDP ranks over gloo, 2 steps, two shuffled PPO mini-batches a step (tau_h per mini-batch),
# Lopti on, a warmup; the run folder and the rollout dump
STAPO_TWO_RANKS = [
    "algo=stapo",
    "trainer.n_gpus_per_node=2",
    "trainer.total_training_steps=2",
    "trainer.save_freq=-1",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    "actor_rollout_ref.actor.shuffle=true",
    "actor_rollout_ref.actor.policy_loss.lopti=true",
    "actor_rollout_ref.actor.optim.lr_warmup_steps=10",
]


# algo=stapo with a tau_p no token is below and GRPO's clip and KL (the pair of GRPO above), 2 steps, validation after
# each step at val_kwargs and at T0.7; verl's own agent-loop manager, so verl's reward-loop actor (which the CPU
# presets leave out) scores
SILENT_STAPO = [
    "algo=stapo",
    "trainer.total_training_steps=2",
    "trainer.save_freq=-1",
    "actor_rollout_ref.actor.policy_loss.tau_p=1e-30",
    "actor_rollout_ref.actor.clip_ratio_high=0.2",
    "actor_rollout_ref.actor.use_kl_loss=true",
    "actor_rollout_ref.actor.kl_loss_coef=0.001",
    "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
    "trainer.test_freq=1",
    "stapo.val_decodings=[T0.7]",
    "actor_rollout_ref.rollout.agent.agent_loop_manager_class=null",
    "reward.num_workers=1",
]


@dataclass
class SharedRun:
    """A finished trainer run and the folders it wrote (``run_dir``/``rollouts``/``validations``: None when not
    asked for)."""

    run: Run
    overrides: list[str]
    ckpt: Path
    run_dir: Path | None
    rollouts: Path | None
    validations: Path | None = None

    @property
    def steps(self) -> dict[int, dict[str, float]]:
        return self.run.steps

    def tail(self, chars: int = 6000) -> str:
        return self.run.log[-chars:]


def launch(root: Path, overrides: list[str], *, run_dir: bool = False, rollouts: bool = False,
           timeout: int = RUN_TIMEOUT_S) -> SharedRun:
    """One run of the tiny trainer under ``root``: checkpoints in ``root/ckpt``, optionally the run folder
    (``stapo.run_dir``) in ``root/run`` and verl's rollout dump (``trainer.rollout_data_dir``) in ``root/rollouts``.

    A run on the HF server joins this pytest process's Ray head (``tests.e2e.cpu_runs.session_ray``): no Ray start
    of its own, the same numbers (docs/testing.md, "Where a launch's time goes")."""
    root.mkdir(parents=True, exist_ok=True)
    extra = []
    if run_dir:
        extra.append(f"stapo.run_dir={root / 'run'}")
    if rollouts:
        extra.append(f"trainer.rollout_data_dir={root / 'rollouts'}")
    # vLLM's runs keep a Ray of their own: the engine processes vLLM forks are then in the run's session, ended with it
    vllm = "actor_rollout_ref.rollout.name=vllm" in overrides
    run = run_recipe([*overrides, *extra], root / "ckpt", timeout=timeout, cluster=None if vllm else session_ray())
    return SharedRun(run, [*overrides, *extra], root / "ckpt", root / "run" if run_dir else None,
                     root / "rollouts" if rollouts else None)


def train_cli(root: Path, overrides: list[str], *, timeout: int = RUN_TIMEOUT_S) -> SharedRun:
    """``python -m stapo.cli train model_preset=tiny OVERRIDES`` in a fresh interpreter, run in ``root`` as a user runs
    it in a folder of theirs: the run folder is the relative ``stapo.run_dir=run`` (the command resolves it against
    its cwd, so ``root/run``), the generated data go to ``root/data`` (the same bytes as the cache folder the other
    runs read: the task is a function of its rows and seed, stapo/data/tasks.py), checkpoints to ``root/ckpt``, verl's
    rollout and validation dumps to ``root/rollouts`` and ``root/val``.

    It joins this pytest process's Ray head as ``launch`` does: ``RAY_ADDRESS`` in the command's environment, which
    its recipe child inherits (``stapo.runs.process.run_recipe_process``), and the ``JOIN`` overrides, which the
    command composes, checks and passes on to the recipe as given (docs/testing.md, "Where a launch's time goes").

    The ``Run``'s log is the command's console (stdout, then stderr); its steps are read as every shared run's are
    (``logged_steps``): the recipe's console, which the command writes to ``run/trainer.log``, completed from the run
    folder's ``metrics.jsonl``. The peak memory is not measured (0): no user of this run reads it."""
    root.mkdir(parents=True, exist_ok=True)
    cluster = session_ray()
    args = ["model_preset=tiny", *overrides, f"stapo.synthetic_data_dir={root / 'data'}", "stapo.run_dir=run",
            f"trainer.default_local_dir={root / 'ckpt'}", f"trainer.rollout_data_dir={root / 'rollouts'}",
            f"trainer.validation_data_dir={root / 'val'}", *JOIN]
    env = dict(os.environ, WANDB_MODE="offline", RAY_ADDRESS=cluster.address)
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "stapo.cli", "train", *args], cwd=root, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace")
    out, err = _finish(proc, timeout)
    run_dir = root / "run"
    trainer_log = run_dir / "trainer.log"
    console = trainer_log.read_text(encoding="utf-8", errors="replace") if trainer_log.is_file() else ""
    run = Run(proc.returncode, out + err, time.monotonic() - started, 0,
              logged_steps(console, [f"stapo.run_dir={run_dir}"]))
    return SharedRun(run, args, root / "ckpt", run_dir, root / "rollouts", root / "val")


def _finish(proc: subprocess.Popen, timeout: int) -> tuple[str, str]:
    """The command's (stdout, stderr) once it exits. Past ``timeout`` it gets Ctrl-C, as a user would give it: the
    command stops its recipe child (which runs in a session of its own, out of reach of a kill of the command)."""
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=STOP_GRACE_S + 30)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    return out, err + f"\n[test] stopped after {timeout} s\n"


@pytest.fixture(scope="session")
def stapo_run(tmp_path_factory) -> SharedRun:
    """STAPO, 4 steps, checkpoints at steps 2 and 4, with the run folder and the rollout dump.

    Users, and what each used to launch on its own:
    - tests/e2e/test_trainer_cpu.py::test_stapo_trains_and_checkpoints (the same run, 2 steps, no dump)
    - tests/export/test_export_e2e.py, all tests (the same 2-step run, exported)
    - tests/e2e/test_reproducible.py::test_grpo_and_stapo_see_identical_first_rollouts (2 steps, dump)
    - tests/bench/test_algos_train.py, the masked_clip objective with the S2T mask folded
    """
    return launch(tmp_path_factory.mktemp("shared-stapo"), STAPO, run_dir=True, rollouts=True)


@pytest.fixture(scope="session")
def grpo_run(tmp_path_factory) -> SharedRun:
    """GRPO, 2 steps, with the rollout dump, started without the preset's STAPO_CPU_BACKEND.

    Users (each launched this 2-step GRPO run itself, four launches in all, before the runs were shared):
    - tests/e2e/test_trainer_cpu.py::test_baselines_run_through_the_same_trainer[grpo]
    - tests/e2e/test_reproducible.py::test_grpo_and_stapo_see_identical_first_rollouts
    - tests/e2e/test_paired.py::test_stapo_that_silences_nothing_is_grpo (metrics and rollout dumps)
    """
    return launch(tmp_path_factory.mktemp("shared-grpo"), GRPO, rollouts=True)


@pytest.fixture(scope="session")
def entropy20_run(tmp_path_factory) -> SharedRun:
    """20-Entropy, 2 steps, checkpoint of step 2.

    Users: tests/e2e/test_trainer_cpu.py::test_baselines_run_through_the_same_trainer[entropy20] and
    tests/bench/test_algos_train.py (the entropy20 token mask trains: finite loss, gradient, new weights).
    """
    return launch(tmp_path_factory.mktemp("shared-entropy20"), ENTROPY20)


@pytest.fixture(scope="session")
def stapo_two_ranks_run(tmp_path_factory) -> SharedRun:
    """STAPO on two FSDP ranks, 2 steps, two shuffled mini-batches a step, Lopti on, with the run folder and the
    rollout dump.

    Users:
    - tests/e2e/test_trainer_cpu.py::test_stapo_with_two_fsdp_ranks_over_gloo (launched it itself before)
    - tests/e2e/test_custom_rule_runs.py::test_the_s2t_rule_file_trains_as_algo_stapo (the same run with the rule
      from recipe/stapo/examples/s2t_rule.py must equal this one bit for bit)
    """
    return launch(tmp_path_factory.mktemp("shared-stapo-two-ranks"), STAPO_TWO_RANKS, run_dir=True, rollouts=True)


@pytest.fixture(scope="session")
def silent_stapo_train_run(tmp_path_factory) -> SharedRun:
    """STAPO silencing nothing with GRPO's clip and KL (``SILENT_STAPO``), 2 steps, validated after each, started
    through `stapo train` (``train_cli``: a relative run folder, the rollout and validation dumps).

    Users (each launched it itself before, two launches):
    - tests/e2e/test_paired.py::test_stapo_that_silences_nothing_is_grpo (every metric and rollout equal the
      shared GRPO run's; the two validation passes)
    - tests/demo/test_train_command.py (the command's progress lines, ETA, the validation's time counted, the run
      folder's trainer.log; it ran the tiny preset's own settings, 2 steps, validated after each)
    """
    return train_cli(tmp_path_factory.mktemp("shared-silent-stapo-train"), SILENT_STAPO)


def pytest_sessionfinish(session, exitstatus) -> None:
    """The Ray head the runs joined stops with the session (each pytest-xdist worker stops its own)."""
    stop_session_ray()
