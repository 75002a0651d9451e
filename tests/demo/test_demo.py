"""`stapo demo` on its two models, at tiny sizes: the testbed (built here) and the real SmolLM2-135M-Instruct
weights (shipped by a package).

The training tests run the whole demo: the real recipe (Ray, verl's trainer, FSDP2 over gloo, the
HF rollout), validation before and after, checkpoint, plots; on the testbed for STAPO and the GRPO
baseline, on SmolLM2 one STAPO step.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stapo.rundir import read_metrics

pytestmark = pytest.mark.timeout(1200)
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def stapo_cli(*args: str, timeout: int) -> subprocess.CompletedProcess:
    """``stapo ARGS`` in a fresh interpreter, offline (no hub, wandb offline)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", WANDB_MODE="offline")
    command = [sys.executable, "-m", "stapo.cli", *args]
    return subprocess.run(command, check=False, capture_output=True, text=True, timeout=timeout, env=env)


@pytest.mark.slow  # SmolLM2-135M: converted once, then a batch of real rollouts; 1-2.5 min on 2 cores
def test_demo_analysis_runs_on_real_weights(tmp_path):
    out = tmp_path / "run"
    proc = stapo_cli(
        "demo", "--analyze", "--prompts", "2", "--group-size", "4", "--max-new-tokens", "12", "--out", str(out),
        "--tau-p", "0.05", timeout=800,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "S2T analysis" in proc.stdout
    metrics = json.loads((out / "s2t_analysis.json").read_text())
    assert metrics["response_tokens"] > 0 and 0.0 <= metrics["mask_ratio"] <= 1.0
    assert 0.0 <= metrics["accuracy"] <= 1.0
    for line in (out / "spurious_tokens.jsonl").read_text().splitlines():
        record = json.loads(line)
        assert record["prob"] < 0.05 and set(record) >= {"token", "before", "after", "entropy"}


@pytest.fixture(scope="module")
def quick_testbed(tmp_path_factory) -> str:
    """The testbed's build with a few supervised steps: its code paths and files in seconds (the default
    build, 320 steps, is the demo's own and takes minutes; a folder holding the build's marker runs as the
    testbed)."""
    from stapo.models.testbed import build_testbed_model
    from tests.unit.test_testbed import QUICK

    return build_testbed_model(tmp_path_factory.mktemp("testbed"), QUICK)


def check_demo_run(out: Path, algo: str, steps: int, proc: subprocess.CompletedProcess) -> dict:
    """What every demo run writes: progress lines, validation before and after, checkpoint, config, summary."""
    assert f"[{algo}] step {steps}/{steps} |" in proc.stdout
    assert f"[{algo}] held-out accuracy before training" in proc.stdout
    run = out / algo
    logged = read_metrics(run)
    assert set(range(steps + 1)) <= set(logged)
    assert "val/average/acc" in logged[0] and "val/average/acc" in logged[steps]  # before and after training
    assert "reward/acc/mean" in logged[1] and "timing_s/step" in logged[steps]
    assert (run / "checkpoints" / "latest_checkpointed_iteration.txt").read_text().strip() == str(steps)
    config = (run / "config.yaml").read_text()
    assert "loss_mode: masked_clip" in config  # one objective; the algorithm is the token mask
    assert f"token_mask: {'stapo' if algo == 'stapo' else 'none'}" in config
    summary = json.loads((run / "summary.json").read_text())
    assert summary["algo"] == algo and summary["peak_rss_gib"] > 0.1 and summary["heldout_acc_after"] is not None
    return logged


@pytest.mark.e2e
def test_demo_trains_stapo_and_grpo_on_the_testbed_and_plots_both(tmp_path, quick_testbed):
    out = tmp_path / "demo"
    proc = stapo_cli(
        "demo", "--model", quick_testbed, "--steps", "2", "--prompts", "2", "--group-size", "4",
        "--max-new-tokens", "24", "--heldout", "4", "--tau-p", "0.05", "--out", str(out), "--compare", "grpo",
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "task: addition of three 2-3 digit numbers" in proc.stdout
    for algo in ("stapo", "grpo"):
        logged = check_demo_run(out, algo, 2, proc)
        # the testbed validates on as many samples a problem as it trains on (4 here), not one greedy answer
        assert any(key.startswith("val-core/") and key.endswith("/acc/mean@4") for key in logged[0]), sorted(logged[0])
        config = (out / algo / "config.yaml").read_text()
        # the testbed preset: its optimizer, and the paper's strict reward (not the word problems' graded one)
        assert "optimizer: GainAdamW" in config and "path: pkg://stapo.reward\n" in config
    assert "actor/stapo/mask_ratio" in read_metrics(out / "stapo")[1]
    for name in ("reward.png", "entropy.png", "mask.png"):
        assert (out / "plots" / name).read_bytes()[:8] == PNG_SIGNATURE
    table = (out / "plots" / "summary.md").read_text()
    assert "| stapo | 2 |" in table and "| grpo | 2 |" in table
    log = out / "stapo" / "spurious_tokens.jsonl"
    for line in log.read_text().splitlines() if log.exists() else []:
        record = json.loads(line)
        assert record["prob"] < 0.05 and record["step"] in (1, 2) and isinstance(record["token"], str)


@pytest.mark.e2e
def test_demo_trains_smollm2_on_its_word_problems(tmp_path):
    """The real pretrained LLM on the same pipeline, with the preset's rollout (verl's vLLM server on vLLM's
    CPU build): one step, at the smallest sizes."""
    out = tmp_path / "demo"
    proc = stapo_cli(
        "demo", "--model", "smollm2", "--steps", "1", "--prompts", "1", "--group-size", "2", "--max-new-tokens",
        "16", "--heldout", "2", "--out", str(out), timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "easy arithmetic problems" in proc.stdout
    check_demo_run(out, "stapo", 1, proc)
    config = (out / "stapo" / "config.yaml").read_text()
    assert "smollm2-135m-instruct" in config and "stapo.reward.arithmetic" in config
    assert "name: vllm" in config  # the preset samples through verl's vLLM rollout on vLLM's CPU build


def test_demo_rejects_bad_settings_before_loading_anything():
    """One line naming the option as it is typed, exit 2 (a refused setting, as on every command)."""
    for args, message in (
        (["--tau-p", "2"], "stapo: demo: --tau-p: tau_p must be a probability in (0, 1)"),
        (["--entropy-quantile", "0"], "stapo: demo: --entropy-quantile: entropy_quantile must be in (0, 1]"),
        (["--group-size", "1"], "stapo: demo: --group-size must be >= 2"),
        (["--compare", "stapo"], "stapo: demo: --compare stapo repeats --algo stapo"),
        (["--level", "hard"], "stapo: demo: --level applies to the arithmetic task"),
        (["--analyze", "--model", "testbed"], "stapo: demo: --analyze runs on the arithmetic word problems"),
        # a bare name is neither a folder nor an org/name hub id: refused before Ray, not downloaded as a legacy id
        (["--model", "qwen"], "stapo: demo: --model qwen: not one of ['testbed', 'smollm2', 'tailbed'], nor a model "
         "folder here, nor a hub id of the form org/name"),
        (["--model", "testbd"], "(did you mean 'testbed'?)"),
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "stapo.cli", "demo", *args], check=False, capture_output=True, text=True, timeout=120
        )
        assert proc.returncode == 2, (args, proc.stderr)
        assert message in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_plot_command_refuses_a_folder_without_metrics(tmp_path):
    proc = stapo_cli("plot", str(tmp_path), timeout=120)
    assert proc.returncode == 2 and "neither metrics.jsonl nor a wandb offline run" in proc.stderr
    assert not Path(tmp_path / "plots").exists()


@pytest.mark.parametrize("model", ["tailbed", "folder"])
def test_a_tailbed_runs_as_its_preset_with_the_testbeds_task(tmp_path, model):
    """``--model tailbed``, or a folder the tailbed's build wrote (its marker file), trains the tailbed preset on
    the testbed's task and sizes: the demo's command line composed through the recipe's real Hydra config and
    checked as a run is (paths aside: no model is built here)."""
    from stapo.check import check_run, compose_run
    from stapo.demo.cli import build_parser, demo_model, fill_defaults, trainer_overrides
    from stapo.models.tailbed import MARKER

    if model == "folder":
        model = str(tmp_path / "built")
        Path(model).mkdir()
        (Path(model) / MARKER).write_text("{}")
    args = fill_defaults(build_parser().parse_args(["--model", model]))
    assert demo_model(args).preset == "tailbed" and demo_model(args).task == "addition"
    assert (args.steps, args.prompts, args.group_size, args.temperature) == (100, 8, 8, 1.0)
    overrides = trainer_overrides(args, "stapo", tmp_path / "run", tmp_path / "data", "/models/tailbed")
    config = compose_run(overrides)
    check_run(config, paths=False)
    assert config.actor_rollout_ref.model.path == "/models/tailbed"
    assert config.trainer.experiment_name == "demo-stapo" and config.stapo.synthetic_task == "addition"
    # validated before training and every 20 steps: six points of the held-out curve
    assert config.trainer.test_freq == 20 and config.trainer.val_before_train is True
    assert config.actor_rollout_ref.actor.optim.optimizer == "GainAdamW"
    assert "tailbed" in compose_run(["model_preset=tailbed"]).actor_rollout_ref.model.path


def test_demo_model_choices_a_stapo_name_a_hub_id_or_a_folder(tmp_path):
    """``stapo://testbed`` is the testbed, run as its preset; an org/name hub id and an existing folder of any name
    pass the choice (the folder's and the id's own checks follow); a bare name does not."""
    from stapo.algorithm.validation import STAPOConfigError
    from stapo.demo.cli import build_parser, check_model_choice, demo_model, fill_defaults

    args = fill_defaults(build_parser().parse_args(["--model", "stapo://testbed"]))
    assert args.model == "testbed" and demo_model(args).preset == "testbed"
    check_model_choice("HuggingFaceTB/SmolLM2-135M-Instruct")
    (tmp_path / "qwen").mkdir()
    check_model_choice(str(tmp_path / "qwen"))
    with pytest.raises(STAPOConfigError, match="--model qwen: not one of"):
        check_model_choice("qwen")
