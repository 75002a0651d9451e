"""The CUDA engine check (launch/cuda_check/engine_check.py) run on the CPU, so it cannot rot before a GPU runs it.

Two gloo ranks under torchrun drive the plugin's ``STAPOActorWorker`` and verl's real FSDP2 engine through the
old-policy pass, an update, a checkpoint save and load, for STAPO, TACO and Lopti, with the GPU smoke preset's
knobs (padding-free batches, dynamic batch size, gradient checkpointing, bf16 mixed precision, four mini-batches);
only the device (cpu, gloo, sdpa) and torch.compile (off) differ from a CUDA run. The script's own checks decide
its exit code; this test also reads its JSON so a check that silently stopped running would fail here. Ray is
the script's stub (launch/cuda_check/no_ray.py) here as on the GPU machine. About 2 minutes on 2 cores.
"""

from __future__ import annotations

import json
import math
import os
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

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("cuda_check") / "cuda_engine_check.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(SCRIPT),
               "--device", "cpu", "--out", str(out)]
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-6000:]
    return json.loads(out.read_text())


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
