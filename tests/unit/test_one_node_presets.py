"""The one-node presets (conf/model_preset/qwen3_*_1node.yaml) and docs/one-node.md, which derives them.

Each one-node preset composes with each algorithm through the recipe's own Hydra composition and passes `stapo
check --no-paths` and verl's driver-side validation; it differs from its 64-GPU preset only in the keys the doc's
table lists (anything else the 64-GPU preset sets or gains is inherited). The doc's arithmetic (tokens a step,
FSDP state and vLLM memory a GPU) is recomputed here from the presets' composed numbers and the models' sizes, its
shell commands are checked as tests/launch/test_doc_commands.py checks the other docs, and its 4B example preset
composes and passes the checks. Also the refusals a one-node user meets: a model size without a preset (no
misleading did-you-mean, a pointer to the doc) and the SP batch check's numbers.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf
from verl.trainer.ppo.utils import need_critic, need_reference_policy
from verl.utils.config import validate_config

from stapo.algorithm.validation import STAPOConfigError
from stapo.check import NEW_SIZE_DOC, check_run, compose_run
from stapo.cli import main as stapo_main
from stapo.verl_plugin.preflight.run_checks import validate_run_config
from tests.launch.test_doc_commands import commands_of, problems_of
from tests.recipe_config import config_for_verl, recipe_config

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "one-node.md"
ONE_NODE = {"qwen3_1p7b_1node": "qwen3_1p7b", "qwen3_8b_1node": "qwen3_8b", "qwen3_14b_1node": "qwen3_14b"}
ALGOS = ("stapo", "grpo")  # no reference model, and one (a KL loss); tests/e2e/test_compose.py runs all four
AR = "actor_rollout_ref"
# what a one-node preset may change from its 64-GPU preset (docs/one-node.md, "The values to change")
CHANGED = {"trainer.nnodes", "trainer.n_gpus_per_node", "data.train_batch_size", f"{AR}.actor.ppo_mini_batch_size",
           f"{AR}.actor.ppo_max_token_len_per_gpu", f"{AR}.rollout.gpu_memory_utilization",
           "trainer.experiment_name"}
GiB = 2**30
# Qwen3 base models' config.json: hidden, layers, attention heads, KV heads, head dim, MLP, vocabulary, tied embeddings
ARCH = {
    "1.7B": (2048, 28, 16, 8, 128, 6144, 151936, True),
    "4B": (2560, 36, 32, 8, 128, 9728, 151936, True),
    "8B": (4096, 36, 32, 8, 128, 12288, 151936, False),
    "14B": (5120, 40, 40, 8, 128, 17408, 151936, False),
}
SIZE = {"qwen3_1p7b_1node": "1.7B", "qwen3_8b_1node": "8B", "qwen3_14b_1node": "14B"}
TEXT = DOC.read_text(encoding="utf-8")


def leaves(node, prefix: str = "") -> dict:
    if isinstance(node, dict) and node:
        found = {}
        for key, value in node.items():
            found.update(leaves(value, f"{prefix}{key}."))
        return found
    return {prefix[:-1]: node}


def raw(preset: str, *overrides: str) -> dict:
    """Every leaf of the composed recipe, interpolations as written."""
    return leaves(OmegaConf.to_container(compose_run([f"model_preset={preset}", *overrides]), resolve=False))


def parameters(hidden, layers, heads, kv_heads, head_dim, mlp, vocab, tied) -> int:
    attention = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2 + 2 * head_dim
    layer = attention + 3 * hidden * mlp + 2 * hidden
    return layers * layer + vocab * hidden * (1 if tied else 2) + hidden


# ------------------------------------------------------------------------------------------------- the presets


@pytest.mark.parametrize("preset", ONE_NODE)
@pytest.mark.parametrize("algo", ALGOS)
def test_one_node_preset_passes_stapo_check(preset, algo, capsys):
    assert stapo_main(["check", "--no-paths", f"model_preset={preset}", f"algo={algo}"]) == 0
    out = capsys.readouterr().out
    assert "1 node x 8 GPUs" in out and out.endswith("OK\n")
    cfg = config_for_verl(f"model_preset={preset}", f"algo={algo}")
    validate_config(config=cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    assert cfg.trainer.experiment_name == f"{preset}-{algo}"


@pytest.mark.parametrize("preset, base", ONE_NODE.items())
def test_one_node_preset_changes_only_the_listed_keys(preset, base):
    mine, theirs = raw(preset), raw(base)
    changed = {key for key in set(mine) | set(theirs) if mine.get(key, "<absent>") != theirs.get(key, "<absent>")}
    assert changed <= CHANGED, sorted(changed - CHANGED)
    assert {"trainer.nnodes", "data.train_batch_size", f"{AR}.actor.ppo_mini_batch_size"} <= changed
    assert (mine["trainer.nnodes"], mine["trainer.n_gpus_per_node"]) == (1, 8)
    # the paper's 4 PPO updates a step, its group size and its lengths are kept
    assert mine["data.train_batch_size"] // mine[f"{AR}.actor.ppo_mini_batch_size"] == 4
    assert theirs["data.train_batch_size"] // theirs[f"{AR}.actor.ppo_mini_batch_size"] == 4
    for key in (f"{AR}.rollout.n", "data.max_response_length", "data.max_prompt_length",
                f"{AR}.rollout.tensor_model_parallel_size", f"{AR}.actor.optim.lr"):
        assert mine[key] == theirs[key], key


# ------------------------------------------------------------------------------------------------- the doc's figures


def test_the_docs_tokens_a_step_are_the_presets():
    """`train_batch_size x n x (prompt + response)` as the doc writes it, for the paper and the one-node presets."""
    for preset, gpus in (("qwen3_8b", 64), ("qwen3_8b_1node", 8)):
        cfg = recipe_config(f"model_preset={preset}")
        batch, n = cfg.data.train_batch_size, cfg.actor_rollout_ref.rollout.n
        prompt, response = cfg.data.max_prompt_length, cfg.data.max_response_length
        tokens = batch * n * (prompt + response)
        line = f"{batch} x {n} x ({prompt} + {response}) = {tokens:,} tokens a step, {tokens // gpus:,} a GPU"
        assert line in TEXT, line
    per_gpu = 64 * 8 * 16384 // 8
    budget = recipe_config("model_preset=qwen3_8b_1node").actor_rollout_ref.actor.ppo_max_token_len_per_gpu
    assert f"splits its {per_gpu:,} tokens into at least {per_gpu // budget} micro-batches" in TEXT


@pytest.mark.parametrize("size", ARCH)
def test_the_docs_memory_figures_follow_from_the_model_sizes(size):
    """P, the FSDP state (16 bytes a parameter) over 64 and 8 GPUs, as the doc's tables print them."""
    p = parameters(*ARCH[size])
    assert f"| {p / 1e9:.2f}e9 |" in TEXT or f"| {p / 1e9:.3g}e9 |" in TEXT, (size, p)
    row = f"| Qwen3-{size} | {16 * p / 64 / GiB:.1f} GiB | {16 * p / 8 / GiB:.1f} GiB |"
    assert row in TEXT, row


@pytest.mark.parametrize("preset", ONE_NODE)
def test_the_docs_rollout_memory_fits_each_preset(preset):
    """The rollout-phase row of the doc for the preset's own utilization and TP on 80 GB: the FSDP state plus
    vLLM's share fits in 80 GiB, and the KV cache a token is the model's."""
    cfg = recipe_config(f"model_preset={preset}")
    _, layers, _, kv_heads, head_dim, *_ = ARCH[SIZE[preset]]
    tp = cfg.actor_rollout_ref.rollout.tensor_model_parallel_size
    util = cfg.actor_rollout_ref.rollout.gpu_memory_utilization
    p = parameters(*ARCH[SIZE[preset]])
    fsdp, vllm = 16 * p / 8 / GiB, util * 80
    assert fsdp + vllm < 80 - 4, "leave room for the processes' CUDA contexts"
    kv_kib = 2 * layers * kv_heads * head_dim * 2 // tp // 1024
    kv_cache = util * 80 - 2 * p / tp / GiB - 4
    row = (f"| {SIZE[preset]} ({tp}) | 80 GB | {util} | {fsdp:.1f} + {vllm:.1f} = {fsdp + vllm:.1f} GiB | "
           f"{kv_cache:.1f} GiB, {kv_kib} KiB a token |")
    assert row in TEXT, row
    assert 8 % tp == 0


def test_the_doc_says_the_paper_values_do_not_fit_14b_on_80_gb():
    p = parameters(*ARCH["14B"])
    assert 16 * p / 8 / GiB + 0.7 * 80 > 80
    assert "| 14B (4) | 80 GB | 0.7 | 27.5 + 56.0 = 83.5 GiB: **does not fit** |" in TEXT


# ------------------------------------------------------------------------------------------------- the doc's commands


DOC_COMMANDS = tuple(commands_of("docs/one-node.md", TEXT))


@pytest.mark.parametrize("command", DOC_COMMANDS, ids=[f"{c.line}:{' '.join(c.argv[:3])}" for c in DOC_COMMANDS])
def test_every_command_of_the_doc_names_only_what_exists(command):
    problems = problems_of(command, DOC_COMMANDS)
    assert not problems, f"{command}\n  " + "\n  ".join(problems)


def test_the_doc_runs_the_smoke_preset_and_its_gpu_commands_are_marked():
    argvs = [command.argv for command in DOC_COMMANDS]
    assert ("stapo", "train", "model_preset=qwen3_0p6b_smoke") in argvs
    assert ("stapo", "check", "model_preset=qwen3_0p6b_smoke") in argvs
    for command in DOC_COMMANDS:
        if command.argv[:2] == ("stapo", "train") or command.argv[:2] == ("python", "-m"):
            assert command.gpu_only, command


def test_the_docs_4b_example_composes_and_passes_the_checks():
    """The yaml block under "A preset for another model size", applied as overrides on the preset it builds on."""
    section = TEXT.split("## A preset for another model size", 1)[1]
    block = re.search(r"```yaml\n(.*?)```", section, flags=re.DOTALL).group(1)
    example = yaml.safe_load(block)
    base = [entry for entry in example.pop("defaults") if entry != "_self_"]
    overrides = [f"{key}={value}" for key, value in leaves(example).items() if "${" not in str(value)]
    config = compose_run([f"model_preset={base[0]}", *overrides])
    check_run(config, paths=False)
    assert config.actor_rollout_ref.model.path == "Qwen/Qwen3-4B-Base"
    assert config.actor_rollout_ref.rollout.tensor_model_parallel_size == 1
    assert str(example["trainer"]["experiment_name"]).startswith("qwen3_4b_1node-")


# ------------------------------------------------------------------------------------------------- refusals


def refusal(*overrides: str) -> str:
    with pytest.raises(STAPOConfigError) as error:
        compose_run(list(overrides))
    text = str(error.value)
    assert "\n" not in text
    return text


@pytest.mark.parametrize("preset", ["qwen3_4b", "qwen3_32b", "qwen3_4b_1node"])
def test_a_model_size_without_a_preset_points_to_the_doc_not_to_another_size(preset):
    text = refusal(f"model_preset={preset}")
    assert text.startswith(f"model_preset={preset}: no such preset, choose one of [")
    assert "did you mean" not in text and "'qwen3_8b'" in text
    assert text.endswith(f"; for a model size without a preset see {NEW_SIZE_DOC}")
    heading = re.search(r'\("(.*)"\)', NEW_SIZE_DOC).group(1)
    assert f"## {heading}\n" in TEXT and NEW_SIZE_DOC.startswith("docs/one-node.md")


@pytest.mark.parametrize("typo, meant", [("qwen3_8", "qwen3_8b"), ("qwen3_1p7", "qwen3_1p7b"),
                                         ("qwen3_8b_1nod", "qwen3_8b_1node")])
def test_a_real_typo_of_a_preset_keeps_its_did_you_mean(typo, meant):
    assert refusal(f"model_preset={typo}").endswith(f"(did you mean '{meant}'?)")


def test_other_groups_keep_their_did_you_mean():
    assert refusal("algo=stapoo").endswith("(did you mean 'stapo'?)")


SP_NEW = f"{AR}.actor.fsdp_config.ulysses_sequence_parallel_size"
SP_OLD = f"{AR}.actor.ulysses_sequence_parallel_size"


@pytest.mark.parametrize("overrides, expected", [
    # 64 prompts x 8 in mini-batches of 16: 128 responses; 6 GPUs with SP 2 is DP 3, which does not divide them
    (["trainer.n_gpus_per_node=6", f"{SP_NEW}=2"],
     f"data-parallel size 3 (trainer.nnodes * trainer.n_gpus_per_node / {SP_NEW} = 1 * 6 / 2)"),
    (["trainer.n_gpus_per_node=6", f"{SP_OLD}=2"],
     f"data-parallel size 3 (trainer.nnodes * trainer.n_gpus_per_node / {SP_OLD} = 1 * 6 / 2)"),
    (["trainer.n_gpus_per_node=3", "trainer.nnodes=2"],
     "data-parallel size 6 (trainer.nnodes * trainer.n_gpus_per_node = 2 * 3, no sequence parallelism)"),
])
def test_the_sp_batch_check_prints_the_numbers_and_the_key_it_read(overrides, expected):
    given = ["model_preset=qwen3_1p7b_1node", *overrides]
    with pytest.raises(STAPOConfigError) as error:
        validate_run_config(recipe_config(*given))
    text = str(error.value)
    assert text.startswith(f"{AR}.actor.ppo_mini_batch_size * {AR}.rollout.n (16 * 8 = 128 responses) must be "
                           "divisible by the data-parallel size"), text
    assert text.endswith(expected), text
    assert "ulysses_sequence_parallel_size (" not in text  # the old wording: a bare key, no numbers


@pytest.mark.parametrize("overrides, key", [
    ([f"{AR}.actor.ppo_max_token_len_per_gpu=8192"], f"{AR}.actor.ppo_max_token_len_per_gpu (8192)"),
    (["data.max_response_length=32768"], f"{AR}.actor.ppo_max_token_len_per_gpu (32768)"),
    ([f"{AR}.rollout.log_prob_max_token_len_per_gpu=4096"], f"{AR}.rollout.log_prob_max_token_len_per_gpu (4096)"),
    ([f"{AR}.actor.ppo_max_token_len_per_gpu=4096", f"{SP_NEW}=2"],
     f"{AR}.actor.ppo_max_token_len_per_gpu (4096 x sequence-parallel size 2)"),
])
def test_a_micro_batch_budget_below_one_whole_sequence_is_refused(overrides, key):
    """verl asserts it mid-run, at the first response that long (docs/one-node.md, "When to cut the response
    length"); SP multiplies the budget, as verl's engine does."""
    with pytest.raises(STAPOConfigError) as error:
        validate_run_config(recipe_config("model_preset=qwen3_8b_1node", *overrides))
    assert str(error.value).startswith(f"{key} must be at least data.max_prompt_length + data.max_response_length")


def test_a_budget_of_exactly_one_whole_sequence_is_accepted():
    """qwen3_14b_1node's 16384 = 1024 + 15360; SP 2 makes 8192 enough."""
    validate_run_config(recipe_config("model_preset=qwen3_14b_1node"))
    validate_run_config(recipe_config("model_preset=qwen3_8b_1node", f"{AR}.actor.ppo_max_token_len_per_gpu=8192",
                                      f"{AR}.rollout.log_prob_max_token_len_per_gpu=8192", f"{SP_NEW}=2"))
