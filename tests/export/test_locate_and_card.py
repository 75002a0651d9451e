"""`stapo export`'s choice of step and its model card, on checkpoint folders laid out as verl saves them.

The folders hold the files verl writes (``fsdp_config.json``, one shard per rank, ``huggingface/``,
``latest_checkpointed_iteration.txt``); the shards' content does not matter to these checks, the
e2e test (test_export_e2e.py) exports a real one.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from stapo.export import card
from stapo.export.cli import main
from stapo.export.locate import ExportError, locate


def _step(root: Path, step: int, world_size: int = 1, ranks: int | None = None) -> Path:
    actor = root / f"global_step_{step}" / "actor"
    (actor / "huggingface").mkdir(parents=True)
    (actor / "fsdp_config.json").write_text(json.dumps({"FSDP_version": 2, "world_size": world_size}))
    (actor / "huggingface" / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"]}))
    for rank in range(world_size if ranks is None else ranks):
        (actor / f"model_world_size_{world_size}_rank_{rank}.pt").write_bytes(b"x")
    return actor


def _ckpt(tmp_path: Path, steps=(2, 4), latest: int | None = 4) -> Path:
    root = tmp_path / "ckpt"
    for step in steps:
        _step(root, step)
    if latest is not None:
        (root / "latest_checkpointed_iteration.txt").write_text(str(latest))
    return root


def test_latest_step_by_default_and_any_saved_step_on_request(tmp_path):
    root = _ckpt(tmp_path)
    source = locate(root)
    assert (source.step, source.steps, source.run_dir) == (4, [2, 4], None)
    assert source.actor_dir == root / "global_step_4" / "actor"
    assert locate(root, step=2).step == 2
    # a step folder or its actor folder pins the step
    assert locate(root / "global_step_2").step == 2 and locate(root / "global_step_2" / "actor").step == 2


def test_missing_step_lists_the_available_ones(tmp_path):
    root = _ckpt(tmp_path)
    with pytest.raises(ExportError, match=r"step 3 is not saved in .*ckpt; available steps: 2, 4"):
        locate(root, step=3)
    with pytest.raises(ExportError, match="is step 2, but --step 4"):
        locate(root / "global_step_2", step=4)


def test_run_folder_leads_to_its_checkpoints(tmp_path):
    root = _ckpt(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump({"trainer": {"default_local_dir": str(root)}}))
    source = locate(run)
    assert source.ckpt_root == root and source.run_dir == run and source.step == 4

    (run / "config.yaml").write_text(yaml.safe_dump({"trainer": {"default_local_dir": str(tmp_path / "gone")}}))
    with pytest.raises(ExportError, match="trainer.default_local_dir=.*gone, does not exist"):
        locate(run)


def test_errors_name_the_missing_folder_or_file(tmp_path):
    with pytest.raises(ExportError, match="nowhere does not exist"):
        locate(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ExportError, match="neither a checkpoint folder .* nor a run folder"):
        locate(tmp_path / "empty")
    only_latest = tmp_path / "only_latest"
    only_latest.mkdir()
    (only_latest / "latest_checkpointed_iteration.txt").write_text("6")
    with pytest.raises(ExportError, match="holds no saved step .* trainer.save_freq"):
        locate(only_latest)
    torn = tmp_path / "torn"
    _step(torn, 2, world_size=2, ranks=1)
    with pytest.raises(ExportError, match="model_world_size_2_rank_1.pt is missing"):
        locate(torn)
    with pytest.raises(ExportError, match="--run-dir .* has no config.yaml"):
        locate(_ckpt(tmp_path / "x"), run_dir=tmp_path / "empty")


def test_latest_file_naming_a_missing_step_falls_back_with_a_note(tmp_path):
    source = locate(_ckpt(tmp_path, steps=(2, 4), latest=6))
    assert source.step == 4 and "names step 6, which is missing" in source.notes[0]


def test_cli_exits_2_with_the_reason(tmp_path, capsys):
    root = _ckpt(tmp_path)
    assert main([str(root), str(tmp_path / "out"), "--step", "5"]) == 2
    assert "available steps: 2, 4" in capsys.readouterr().err
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "file").write_text("keep me")
    assert main([str(root / "global_step_2"), str(tmp_path / "busy")]) == 2
    assert "exists and is not empty" in capsys.readouterr().err
    assert (tmp_path / "busy" / "file").read_text() == "keep me"


CONFIG = {
    "algorithm": {"adv_estimator": "grpo"},
    "data": {"train_batch_size": 256, "max_prompt_length": 1024, "max_response_length": 15360},
    "actor_rollout_ref": {
        "model": {"path": "Qwen/Qwen3-8B-Base"},
        "actor": {
            "policy_loss": {"loss_mode": "masked_clip", "token_mask": "stapo", "source": "old", "tau_p": 0.002,
                            "entropy_quantile": 0.75, "entropy_top_fraction": 0.2, "entropy_denominator": "all"},
            "clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 10.0, "loss_agg_mode": "token-mean",
            "use_kl_loss": False, "entropy_coeff": 0.0, "optim": {"lr": 1e-6},
        },
        "rollout": {"name": "vllm", "n": 8, "temperature": 1.0},
    },
    "trainer": {"experiment_name": "qwen3_8b-stapo", "nnodes": 8, "n_gpus_per_node": 8, "device": "cuda"},
}


def test_algorithm_shows_the_thresholds_of_the_mask_in_use():
    stapo = card.algorithm(CONFIG)
    assert stapo["loss_mode"] == "masked_clip" and stapo["token_mask"] == "stapo"
    assert stapo["mask_settings"] == {"source": "old", "tau_p": 0.002, "entropy_quantile": 0.75}
    entropy20 = json.loads(json.dumps(CONFIG))
    entropy20["actor_rollout_ref"]["actor"]["policy_loss"]["token_mask"] = "entropy20"
    assert card.algorithm(entropy20)["mask_settings"] == {
        "source": "old", "entropy_top_fraction": 0.2, "entropy_denominator": "all"}
    taco = json.loads(json.dumps(CONFIG))
    taco["actor_rollout_ref"]["actor"]["policy_loss"].update(token_mask="taco", taco_alpha=0.01, taco_lambda=0.9)
    assert card.algorithm(taco)["mask_settings"] == {"source": "old", "taco_alpha": 0.01, "taco_lambda": 0.9}
    grpo = json.loads(json.dumps(CONFIG))
    grpo["actor_rollout_ref"]["actor"]["policy_loss"]["token_mask"] = "none"
    assert card.algorithm(grpo)["mask_settings"] == {}
    lopti = json.loads(json.dumps(grpo))
    lopti["actor_rollout_ref"]["actor"]["policy_loss"].update(lopti=True, lopti_eta=0.5)
    assert card.algorithm(lopti)["mask_settings"] == {"lopti": True, "lopti_eta": 0.5}
    grpo["actor_rollout_ref"]["actor"]["policy_loss"].update(lopti=False, lopti_eta=0.5)
    assert card.algorithm(grpo)["mask_settings"] == {}  # off: not shown


def test_model_card_holds_config_algorithm_and_the_steps_metrics():
    metrics = {"critic/score/mean": 0.4375, "actor/stapo/mask_ratio": 0.00125, "zz/other": 3.0}
    text = card.model_card(step=40, steps=[20, 40], source="/ckpt/global_step_40/actor", dtype="bfloat16",
                           config=CONFIG, model_config={"architectures": ["Qwen3ForCausalLM"]}, metrics=metrics,
                           run_dir="/runs/a")
    front = yaml.safe_load(text.split("---")[1])
    assert front["base_model"] == "Qwen/Qwen3-8B-Base" and "stapo" in front["tags"]
    assert "# qwen3_8b-stapo, step 40" in text and "saved steps: 20, 40" in text and "bfloat16" in text
    assert "| token mask | stapo (source old, tau_p 0.002, entropy_quantile 0.75) |" in text
    assert "| critic/score/mean | 0.4375 |" in text and "| zz/other | 3 |" in text
    # the full resolved config, readable back
    block = text.split("```yaml\n", 1)[1].split("\n```", 1)[0]
    assert yaml.safe_load(block) == CONFIG

    bare = card.model_card(step=2, steps=[2], source="/c", dtype="float32", config=None,
                           model_config={"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"},
                           metrics=None, run_dir=None)
    assert "config is not available" in bare and "No metrics: no run folder was given" in bare
    assert "base_model" not in yaml.safe_load(bare.split("---")[1])
