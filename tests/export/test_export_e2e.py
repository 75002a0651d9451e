"""`stapo export` on a checkpoint the real trainer wrote: the suite's shared tiny STAPO run
(tests/e2e/shared_runs.py: 4 steps, checkpoints at steps 2 and 4, with a run folder), exported once
through the command line and reused by every test of this module.

The reference for the log-probs is independent of the export: the actor's FSDP shard of step 4,
loaded with plain torch into the architecture of the checkpoint's own ``huggingface/config.json``.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from stapo.rundir import read_metrics
from tests.e2e.cpu_runs import REPO

# the shared run's time counts against the first test here when no earlier module ran it
pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(1500)]
STEP = 4  # the shared run's last step: what `stapo export RUN_DIR` picks
PROMPT = "Count the letters: a b c a b. Answer:"


@pytest.fixture(scope="module")
def trained(stapo_run, tmp_path_factory):
    assert stapo_run.run.returncode == 0, stapo_run.tail(4000)
    assert f"trainer.total_training_steps={STEP}" in stapo_run.overrides
    root = tmp_path_factory.mktemp("export")
    ckpt, run_dir = stapo_run.ckpt, stapo_run.run_dir
    out = root / "hf"
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "stapo.cli", "export", str(run_dir), str(out)],
        check=False, cwd=REPO, capture_output=True, text=True, timeout=600,
    )
    print(f"[export] trainer {stapo_run.run.seconds:.0f} s, export {time.monotonic() - started:.1f} s")
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"exported step {STEP} of {ckpt}" in result.stdout
    return {"ckpt": ckpt, "run_dir": run_dir, "out": out, "root": root}


def _actor_model(actor_dir: Path) -> torch.nn.Module:
    """The actor at that step from its FSDP shards, without verl: concatenate each DTensor's local
    shards along its sharded dim (dim 0 for FSDP2) and load them into the HF architecture."""
    shards = sorted(actor_dir.glob("model_world_size_*_rank_*.pt"), key=lambda p: int(p.stem.rsplit("_", 1)[1]))
    states = [torch.load(path, map_location="cpu", weights_only=False) for path in shards]
    state = {}
    for key, value in states[0].items():
        if hasattr(value, "_local_tensor"):
            state[key] = torch.cat([s[key]._local_tensor for s in states], dim=value.placements[0].dim)
        else:
            state[key] = value
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(actor_dir / "huggingface"), dtype=torch.float32)
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)  # tied to the embeddings
    model.tie_weights()
    return model.eval()


@torch.no_grad()
def _log_probs(model, ids: torch.Tensor) -> torch.Tensor:
    """log p(token_t | tokens_<t) of every token after the first."""
    logits = model(ids).logits[:, :-1].float()
    return torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)


def test_export_folder_holds_model_tokenizer_generation_config_and_card(trained):
    out, hf = trained["out"], trained["ckpt"] / f"global_step_{STEP}" / "actor" / "huggingface"
    for name in ("config.json", "model.safetensors", "README.md", "stapo_export.json"):
        assert (out / name).is_file(), name
    # the tokenizer and generation config the trainer used, byte for byte
    for path in hf.iterdir():
        if path.name != "config.json":
            assert (out / path.name).read_bytes() == path.read_bytes(), path.name
    card = (out / "README.md").read_text()
    assert f"step {STEP}" in card and "loss_mode masked_clip" in card
    assert "| token mask | stapo (source old, tau_p 0.002, entropy_quantile 0.75, threshold_scope mini_batch) |" in card
    metrics = read_metrics(trained["run_dir"])[STEP]
    value = metrics["actor/stapo/mask_ratio"]
    assert f"| actor/stapo/mask_ratio | {value:.6g} |" in card
    # the run's own resolved config, whole
    block = card.split("```yaml\n", 1)[1].split("\n```", 1)[0]
    assert yaml.safe_load(block) == yaml.safe_load((trained["run_dir"] / "config.yaml").read_text())


def test_export_log_probs_equal_the_actors_at_that_step(trained):
    from stapo.models.tiny import build_tiny_model

    exported = AutoModelForCausalLM.from_pretrained(trained["out"]).eval()
    assert exported.dtype == torch.float32  # the model config's own dtype, not verl's default bfloat16
    tokenizer = AutoTokenizer.from_pretrained(trained["out"])
    ids = tokenizer(PROMPT, return_tensors="pt").input_ids
    actor = _actor_model(trained["ckpt"] / f"global_step_{STEP}" / "actor")
    ours, theirs = _log_probs(exported, ids), _log_probs(actor, ids)
    assert torch.allclose(ours, theirs, atol=1e-5, rtol=0), (ours - theirs).abs().max()
    # and the export is the trained model, not the one training started from
    initial = AutoModelForCausalLM.from_pretrained(build_tiny_model(), dtype=torch.float32).eval()
    assert (_log_probs(initial, ids) - ours).abs().max() > 1e-3
    # it generates, with the eos/pad of its generation config
    generated = exported.generate(ids, max_new_tokens=6, do_sample=False)
    assert generated.shape[1] > ids.shape[1]


def test_export_of_a_chosen_step_from_the_checkpoint_folder(trained, tmp_path):
    from stapo.export.cli import main

    out = tmp_path / "again"
    assert main([str(trained["ckpt"]), str(out), "--step", str(STEP), "--run-dir", str(trained["run_dir"])]) == 0
    assert (out / "model.safetensors").read_bytes() == (trained["out"] / "model.safetensors").read_bytes()
    # an earlier checkpoint of the same run is another model
    earlier = tmp_path / "step2"
    assert main([str(trained["ckpt"]), str(earlier), "--step", "2", "--run-dir", str(trained["run_dir"])]) == 0
    assert (earlier / "model.safetensors").read_bytes() != (out / "model.safetensors").read_bytes()
    assert main([str(trained["ckpt"]), str(tmp_path / "none"), "--step", "1"]) == 2


def test_stapo_eval_runs_on_the_export(trained):
    from stapo.data.rows import rl_row, write_rows

    data_root, results = trained["root"] / "bench", trained["root"] / "eval"
    question = "What is {a} + {a}? Put the answer in \\boxed{{}}."
    rows = [rl_row("toy", question.format(a=a), str(2 * a), {"index": a}) for a in (1, 2)]
    write_rows(data_root / "toy" / "test.parquet", rows)
    result = subprocess.run(
        [sys.executable, "-m", "stapo.cli", "eval", str(trained["out"]), "--data-root", str(data_root),
         "--benchmarks", "toy", "--n", "2", "--max-tokens", "8", "--backend", "hf", "--decoding", "T1.0",
         "--threads", "1", "--out", str(results)],
        check=False, cwd=REPO, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert (results / "results.md").is_file() and "toy" in (results / "results.md").read_text()
