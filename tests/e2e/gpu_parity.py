"""The GPU-preset parity run: the paper's preset with only what cannot exist on a CPU changed, in one place.

``tests/e2e/test_gpu_preset_parity.py`` runs it; ``tests/unit/test_gpu_preset_drift.py`` keeps it honest: every
key on which the run differs from a GPU preset is listed here with its reason, and a key a GPU preset gains is
either mirrored (the run composes the preset, so it inherits it) or fails that test until it is listed.

The run starts from ``model_preset=qwen3_1p7b`` (the paper's smallest model: ``_qwen3_paper.yaml`` plus the model
and its parallelism) and keeps, as a GPU user gets them: padding-free batches, dynamic batch size, gradient
checkpointing, FSDP2 with verl's default bf16 autocast over fp32 parameters, verl's ``use_torch_compile`` (the
compiled entropy on the padding-free path), several PPO mini-batches a step without shuffling, the paper's
mini-batch quantile scope and the bf16 rollout, and, as the GPU presets default to (``stapo.seeded_rollouts:
false``), verl's own agent loop and replay order, which no other trainer test runs (the CPU presets seed them).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
PRESET_DIR = REPO / "conf" / "model_preset"
START = "qwen3_1p7b"  # the GPU preset the run composes

AR = "actor_rollout_ref"
# per-rank token budget of a micro-batch (update and both log-prob passes). The synthetic task's rows are about 51
# tokens each (measured: 35 of prompt, 16 of response), so a rank's 8 rows of a mini-batch split 3 + 3 + 2 and its 16
# rows of the old-policy pass 3 + 3 + 3 + 3 + 2 + 2: several micro-batches of unequal size. (With 4 equal rows a
# rank no budget gives unequal sizes: verl's split takes ceil(tokens / budget) micro-batches and balances them.)
MICRO_TOKENS = 160


@dataclass(frozen=True)
class Change:
    value: Any
    reason: str


# key -> (the parity run's value, why it cannot be the GPU preset's)
CPU_CHANGES: dict[str, Change] = {
    # what cannot exist on a CPU
    "trainer.device": Change("cpu", "no CUDA device: the project's CPU back-end (gloo, stapo/verl_plugin/cpu)"),
    "trainer.nnodes": Change(1, "one machine"),
    "trainer.n_gpus_per_node": Change(2, "two FSDP ranks over gloo: the smallest DP that shards and all-reduces"),
    f"{AR}.model.path": Change("stapo://tiny", "no hub on the test machine; a 100k-parameter Qwen3 fits 2 cores"),
    f"{AR}.model.override_config.attn_implementation": Change(
        "sdpa", "verl's default flash_attention_2 is CUDA-only; sdpa is torch's own kernel on the CPU"),
    f"{AR}.rollout.name": Change("stapo_hf", "vLLM needs CUDA: the CPU back-end's HF-generate rollout server"),
    f"{AR}.rollout.tensor_model_parallel_size": Change(
        1, "the HF server runs one rank per replica (the presets set 1, 2 or 4 by model size)"),
    # sizes shrunk to fit 2 cores and the suite's budget, ratios kept
    "data.train_batch_size": Change(4, "4 prompts x rollout.n 8 = 32 responses a step (the paper: 256 x 8)"),
    f"{AR}.actor.ppo_mini_batch_size": Change(
        2, "2 mini-batches a step (the paper: 256 / 64 = 4) of 16 responses, 8 per rank: enough rows a rank for "
           "micro-batches of unequal size at 32 responses a step"),
    "data.max_prompt_length": Change(64, "the synthetic task's prompts fit; the paper's 1024 is its math prompts"),
    "data.max_response_length": Change(16, "a tiny model's response; the paper's 15360 would not fit the suite"),
    f"{AR}.actor.ppo_max_token_len_per_gpu": Change(
        MICRO_TOKENS, "small enough that the update splits into several micro-batches of unequal size"),
    f"{AR}.rollout.log_prob_max_token_len_per_gpu": Change(
        MICRO_TOKENS, "the old-policy pass splits too (verl's default follows the actor's, said here explicitly)"),
    f"{AR}.ref.log_prob_max_token_len_per_gpu": Change(
        MICRO_TOKENS, "the reference pass, if a loss asks for one (STAPO has no KL: no reference worker)"),
    "trainer.total_training_steps": Change(2, "two steps: the second runs on weights the first updated"),
    "trainer.val_before_train": Change(False, "a validation pass costs a minute here and checks nothing of the update"),
    "trainer.logger": Change(["console"], "no network for wandb; tests/e2e/test_loggers.py runs the other loggers"),
    "data.dataloader_num_workers": Change(0, "no loader processes on 2 cores (the smoke preset sets 0 too)"),
    # the data and reward: the paper's files are not on the machine, and its reward needs a model that can do math
    "stapo.synthetic_data_dir": Change(
        "${oc.env:STAPO_CACHE,${oc.env:HOME}/.cache/stapo}/synthetic", "the generated task the tiny model knows"),
    "data.train_files": Change("${stapo.synthetic_data_dir}/train.parquet", "the paper's DAPO-Math-17k is not here"),
    "data.val_files": Change("${stapo.synthetic_data_dir}/val.parquet", "the paper's six benchmarks are not here"),
    "reward.custom_reward_function.path": Change(
        "pkg://stapo.reward.synthetic",
        "the paper's boxed-answer reward scores every tiny-model answer -1: all advantages 0, nothing to mask"),
    # processes and threads: verl's defaults start 8 agent-loop workers, 8 reward workers and several storage units
    f"{AR}.rollout.agent.num_workers": Change(1, "one agent-loop worker process (verl: 8) for 32 requests on 2 cores"),
    "reward.num_workers": Change(1, "one reward worker process (verl: 8)"),
    "transfer_queue.backend.SimpleStorage.num_data_storage_units": Change(1, "one TransferQueue storage actor"),
    "ray_kwargs.ray_init.num_cpus": Change(16, "Ray's CPU slots for verl's actors (as the tiny preset, on 2 cores)"),
    "ray_kwargs.ray_init.num_gpus": Change(2, "Ray's GPU slots, which verl's resource pools count: 2 fake ones"),
    "ray_kwargs.ray_init.include_dashboard": Change(False, "no dashboard process"),
    "ray_kwargs.ray_init.runtime_env.env_vars.OMP_NUM_THREADS": Change(
        "1", "one intra-op thread a process: a run's processes share 2 cores"),
    "ray_kwargs.ray_init.runtime_env.env_vars.TOKENIZERS_PARALLELISM": Change("false", "no tokenizer threads"),
    "ray_kwargs.ray_init.runtime_env.env_vars.TQ_NUM_THREADS": Change(
        "1", "TransferQueue's threads (default 8) above the cores warn on every put"),
}

# keys on which the GPU presets disagree among themselves: the parity run keeps the starting preset's value
PRESETS_DISAGREE: dict[str, str] = {
    "stapo.synthetic_task": "the smoke preset's arithmetic task; the tiny model's tokenizer knows the synthetic one",
    "stapo.synthetic_train_rows": "the smoke preset's 64 rows; the run reads 8 of the recipe default's 256",
    "stapo.synthetic_val_rows": "the smoke preset's 16 rows; the run never validates",
    "data.filter_overlong_prompts": "smoke: off, paper: on (kept on: the synthetic prompts all fit)",
    f"{AR}.rollout.n": "smoke: 4, paper: 8 (kept 8)",
    f"{AR}.rollout.gpu_memory_utilization": "vLLM's share of a GPU: not read by the HF server",
    "trainer.save_freq": "paper 20 (after the run's 2 steps: no save, as the paper's first 19 steps)",
    "trainer.test_freq": "paper 20 (no validation in 2 steps)",
    "trainer.resume_mode": "the smoke preset never resumes; the paper's auto finds no checkpoint in a fresh folder",
    "trainer.default_local_dir": "the test's temporary folder (the harness sets it for every run)",
    "trainer.experiment_name": "named after the model preset",
}

# the test harness's own overrides (folders, recorders): not configuration a user chooses
HARNESS_KEYS = ("trainer.default_local_dir", "stapo.run_dir", "ray_kwargs.ray_init._temp_dir")


def override_of(key: str, value: Any, present: bool) -> str:
    """One Hydra override: ``key=value`` for a key the composed config has, ``+key=value`` for a new one."""
    if isinstance(value, bool):
        text = str(value).lower()
    elif isinstance(value, list):
        text = "[" + ",".join(str(item) for item in value) + "]"
    elif isinstance(value, str):
        # quoted: a string stays one ("1", "false" would be read as int and bool, which Ray's env_vars refuse), and
        # Hydra's grammar would read an interpolation's comma as a sweep
        text = f"'{value}'"
    else:
        text = str(value)
    return f"{'' if present else '+'}{key}={text}"


def parity_overrides(start_config=None) -> list[str]:
    """``model_preset=START`` and one override per ``CPU_CHANGES`` entry (``+`` for keys the preset lacks)."""
    from omegaconf import OmegaConf

    from stapo.check import compose_run

    start_config = start_config if start_config is not None else compose_run([f"model_preset={START}"])
    overrides = [f"model_preset={START}"]
    for key, change in CPU_CHANGES.items():
        present = OmegaConf.select(start_config, key, default=_MISSING) is not _MISSING
        overrides.append(override_of(key, change.value, present))
    return overrides


_MISSING = object()


def gpu_presets() -> list[str]:
    """The selectable presets (not ``_shared`` files) that put the run on CUDA."""
    names = []
    for path in sorted(PRESET_DIR.glob("*.yaml")):
        if path.stem.startswith("_"):
            continue
        keys = preset_keys(path.stem)
        if keys.get("trainer.device") == "cuda":
            names.append(path.stem)
    return names


def preset_keys(name: str) -> dict[str, Any]:
    """Every leaf key a preset file sets, its own and those of the files in its ``defaults`` (raw values)."""
    from omegaconf import OmegaConf

    raw = OmegaConf.to_container(OmegaConf.load(PRESET_DIR / f"{name}.yaml"), resolve=False)
    defaults = raw.pop("defaults", []) or []
    keys: dict[str, Any] = {}
    for entry in defaults:
        if isinstance(entry, str) and entry != "_self_":
            keys.update(preset_keys(entry))
    keys.update(dict(leaves(raw)))
    return keys


def leaves(node: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, value) of every leaf of a nested dict; a list or an empty dict is one leaf."""
    if isinstance(node, dict) and node:
        for key, value in node.items():
            yield from leaves(value, f"{prefix}.{key}" if prefix else str(key))
    else:
        yield prefix, node
