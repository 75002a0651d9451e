"""The CUDA engine check (launch/cuda_check/engine_check.py) run on the CPU, so it cannot rot before a GPU runs it.

Two gloo ranks under torchrun drive the plugin's ``STAPOActorWorker`` and verl's real FSDP2 engine through the
old-policy pass, an update, a checkpoint save and load, for STAPO, TACO and Lopti, with the GPU smoke preset's
knobs (padding-free batches, dynamic batch size, gradient checkpointing, bf16 mixed precision, four mini-batches);
only the device (cpu, gloo, sdpa) and torch.compile (off) differ from a CUDA run. The script's own checks decide
its exit code; this test also reads its JSON so a check that silently stopped running would fail here. Ray is
the script's stub (launch/cuda_check/no_ray.py) here as on the GPU machine. About 2 minutes on 2 cores (the run);
the choice of torch.compile by the C compiler found is checked without a run.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "launch" / "cuda_check" / "engine_check.py"
ALGOS = ("stapo", "taco", "lopti")
# every algo reports these checks; a folded mask (STAPO's, TACO's weights) also the token count
CHECKS = (
    "old-policy pass finite",
    "rollout and trainer log-probs agree",
    "losses and grad norms finite",
    "an update moves the weights",
    "loaded weights equal the saved ones",
    "the update after the load repeats the update after the save",
)
FOLDED = ("stapo", "taco")



def engine_check_module():
    """The script as a module (its top level imports the standard library only)."""
    spec = importlib.util.spec_from_file_location("cuda_engine_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("asked, device, compiler, expected", [
    ("auto", "cuda", "/usr/bin/cc", True),
    ("auto", "cuda", None, False),  # an image without a C compiler: off, not a failure in every compiled call
    ("auto", "cpu", "/usr/bin/cc", False),
    ("on", "cpu", "/usr/bin/cc", True),
    ("off", "cuda", "/usr/bin/cc", False),
    ("on", "cuda", None, None),  # refused
])
def test_torch_compile_only_where_a_c_compiler_is_found(asked, device, compiler, expected):
    use, reason = engine_check_module().compile_choice(asked, device, compiler)
    assert use is expected
    if compiler is None:
        assert "no C compiler found ($CC, cc, gcc, clang)" in reason
    if use:
        assert compiler in reason


def test_the_compiler_is_looked_up_as_torch_would(monkeypatch):
    """``$CC`` when set (found or not), else cc, gcc, clang on PATH; argparse refuses ``--compile on`` without."""
    module = engine_check_module()
    found = {"gcc": "/opt/bin/gcc", "clang": "/opt/bin/clang"}
    monkeypatch.setattr(shutil, "which", lambda name: found.get(name))
    monkeypatch.delenv("CC", raising=False)
    assert module.c_compiler() == "/opt/bin/gcc"
    monkeypatch.setenv("CC", "clang")
    assert module.c_compiler() == "/opt/bin/clang"
    monkeypatch.setenv("CC", "icx")
    assert module.c_compiler() is None
    args = module.parse_args(["--out", "x.json", "--device", "cuda"])
    assert args.compile is False and args.compile_reason.startswith("off: no C compiler found")
    with pytest.raises(SystemExit):
        module.parse_args(["--out", "x.json", "--device", "cuda", "--compile", "on"])


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("cuda_check") / "cuda_engine_check.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(SCRIPT),
               "--device", "cpu", "--out", str(out)]
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-6000:]
    return json.loads(out.read_text())


@pytest.mark.slow
def test_every_check_ran_and_passed(report):
    names = {item["name"]: item for item in report["checks"]}
    expected = [f"{algo}: {check}" for algo in ALGOS for check in CHECKS]
    expected += [f"{algo}: verl's token count is the folded mask's" for algo in FOLDED]
    expected.append("plugin registered its loss in verl")
    assert sorted(expected) == sorted(names), sorted(set(expected) ^ set(names))
    assert report["ok"] and all(item["ok"] for item in names.values())
    for algo in FOLDED:
        count = names[f"{algo}: verl's token count is the folded mask's"]
        assert count["verl_tokens"] == count["folded_tokens"] > 0
    assert report["world_size"] == 2 and report["environment"]["ray"].startswith("stub")


@pytest.mark.slow
def test_the_gpu_presets_knobs_were_on(report):
    """The run went through the GPU preset's paths, not the CPU presets': several mini-batches, each split by
    token count, padding-free, checkpointed, in bf16."""
    for algo in ALGOS:
        overrides = report["algos"][algo]["overrides"]
        assert "model_preset=qwen3_0p6b_smoke" in overrides and f"algo={algo}" in overrides
        assert not any("mixed_precision" in o or "use_remove_padding" in o or "checkpointing" in o for o in overrides)
        assert len(report["algos"][algo]["loss"]) == report["settings"]["mini_batches"] * (2 if algo == "lopti" else 1)
    assert report["settings"]["precision"] == "bf16" and report["settings"]["compile"] is False
    # a micro-batch holds fewer tokens than a rank's mini-batch: dynamic batch size really split it
    stapo = report["algos"]["stapo"]
    per_rank_mini_batch = stapo["tokens"]["shard"] / report["settings"]["mini_batches"]
    assert report["settings"]["max_token_len"] < per_rank_mini_batch


@pytest.mark.slow
def test_replay_ran_deterministic_and_was_exact_on_the_cpu(report):
    """The two updates compared ran with deterministic algorithms and the math sdpa backend; on the CPU they repeat
    bit for bit (the CUDA tolerance, 1e-2 of a step, is for ops torch has no deterministic kernel for)."""
    for algo in ALGOS:
        replay = next(c for c in report["checks"] if c["name"] == f"{algo}: {CHECKS[-1]}")
        assert replay["deterministic_algorithms"] is True and replay["sdpa_backend"] == "math"
        assert replay["exact"] is True and replay["limit"] == 0.0 and replay["max_loss_diff"] == 0.0
    assert report["settings"]["compile_reason"].startswith("off (auto on the CPU")


@pytest.mark.slow
def test_the_logprob_tolerance_keeps_its_margin(report):
    """The bf16 limits are at least 3x the worst the script's comment quotes (16 seeds) and 3x what this run
    measured, so a CUDA run with somewhat larger rounding errors does not fail on them."""
    module = engine_check_module()
    max_limit, mean_limit = module.LOGPROB_TOLERANCE["bf16"]
    worst_max, worst_mean = module.LOGPROB_MEASURED["bf16"]
    assert max_limit >= 3 * worst_max and mean_limit >= 3 * worst_mean
    for algo in ALGOS:
        measured = report["algos"][algo]["old_pass"]
        assert 0 < 3 * measured["max_abs_logprob_diff_vs_rollout"] <= max_limit
        assert 0 < 3 * measured["mean_abs_logprob_diff_vs_rollout"] <= mean_limit


@pytest.mark.slow
def test_figures_are_written(report):
    for algo in ALGOS:
        figures = report["algos"][algo]
        assert all(math.isfinite(x) for x in figures["loss"] + figures["grad_norm"])
        assert figures["tokens_per_s"]["update"] > 0 and figures["tokens_per_s"]["old_log_prob"] > 0
        assert figures["memory"]["host_peak_rss_gib"] > 0
        assert {"init_model_s", "old_log_prob_s", "update_s", "save_checkpoint_s", "load_checkpoint_s"} <= set(
            figures["times_s"])
    stapo = report["algos"]["stapo"]["stapo_metrics"]
    assert stapo["actor/stapo/num_dropped"] > 0  # the S2T mask silenced tokens on this batch
    assert report["algos"]["lopti"]["stapo_metrics"]["actor/stapo/lopti/low_fraction"] > 0
    environment = report["environment"]
    assert environment["torch"] and environment["verl"] == "0.9.1" and environment["device_name"]
