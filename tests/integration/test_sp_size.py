"""The sequence-parallel size the pre-flight checks read is the one verl 0.9.1's FSDP engine builds its mesh from.

Each case composes the recipe's real config (Hydra, ``tests/recipe_config.py``) with one spelling of the SP size,
then lets verl resolve it: ``omega_conf_to_dataclass`` builds ``FSDPActorConfig`` (whose ``__post_init__`` moves
the deprecated key onto ``fsdp_config``) for the actor and, after the key renames verl's ``init_model`` makes
(``engine_workers.py``), for the ref; the engine config so built is what ``FSDPEngine._init_device_mesh`` reads,
and ``FSDPEngine.get_data_parallel_size`` divides the world by it. The helper
(``stapo.verl_plugin.preflight.sp_size``) must agree on both roles, and the batch checks must derive DP 2 from SP 2 on 4
ranks. Stand-in: ``torch.distributed.get_world_size`` answers 4 for ``get_data_parallel_size`` (a 4-process
group is what ``tests/integration/sp_ranks.py`` starts for real; here only the division is verl's).
"""

from __future__ import annotations

import types

import pytest
import torch
from omegaconf import open_dict
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.engine.fsdp.transformer_impl import FSDPEngine

from stapo.algorithm.validation import STAPOConfigError
from stapo.verl_plugin.preflight.run_checks import validate_run_config
from stapo.verl_plugin.preflight.sp_size import data_parallel_size, role_sp_size
from tests.recipe_config import config_for_verl, recipe_config

ACTOR, REF = "actor_rollout_ref.actor", "actor_rollout_ref.ref"
NEW, OLD = "fsdp_config.ulysses_sequence_parallel_size", "ulysses_sequence_parallel_size"
ROLLOUT = "actor_rollout_ref.rollout"
ATTN = "actor_rollout_ref.model.override_config.attn_implementation"
# grpo: the KL loss brings the ref (and its own mesh) in; SP needs padding-free batches and flash-attention (only
# composed and checked here: no model is built)
BASE = ("model_preset=tiny", "algo=grpo", "trainer.n_gpus_per_node=4",
        "actor_rollout_ref.model.use_remove_padding=true", f"{ATTN}=flash_attention_2")
WORLD = 4


def verl_sp_sizes(config) -> tuple[int, int]:
    """(actor, ref) SP size as verl's dataclasses resolve them for the FSDP engine."""
    actor = omega_conf_to_dataclass(config.actor_rollout_ref.actor)
    ref_node = config.actor_rollout_ref.ref
    with open_dict(ref_node):  # verl's ActorRolloutRefWorker.init_model, before it builds the ref's config
        ref_node.ppo_mini_batch_size = config.actor_rollout_ref.actor.ppo_mini_batch_size
        ref_node.ppo_micro_batch_size = ref_node.pop("log_prob_micro_batch_size", None)
        ref_node.ppo_micro_batch_size_per_gpu = ref_node.pop("log_prob_micro_batch_size_per_gpu", None)
        ref_node.use_dynamic_bsz = ref_node.pop("log_prob_use_dynamic_bsz", False)
        ref_node.ppo_max_token_len_per_gpu = ref_node.pop("log_prob_max_token_len_per_gpu", None)
    ref = omega_conf_to_dataclass(ref_node)
    return actor.engine.ulysses_sequence_parallel_size, ref.engine.ulysses_sequence_parallel_size


def verl_dp_size(sp: int, monkeypatch) -> int:
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: WORLD)
    return FSDPEngine.get_data_parallel_size(types.SimpleNamespace(ulysses_sequence_parallel_size=sp))


# (overrides, the actor's SP and the key it is named by, the ref's SP)
SPELLINGS = [
    ([], 1, f"{ACTOR}.{NEW}", 1),
    ([f"{ACTOR}.{NEW}=2"], 2, f"{ACTOR}.{NEW}", 1),  # the ref does not follow the actor's fsdp_config key
    ([f"{ACTOR}.{OLD}=2"], 2, f"{ACTOR}.{OLD}", 2),  # ...but does follow its deprecated one
    ([f"{ACTOR}.{NEW}=2", f"{ACTOR}.{OLD}=2"], 2, f"{ACTOR}.{NEW}", 2),
    ([f"{ACTOR}.{NEW}=4", f"{REF}.{NEW}=2"], 4, f"{ACTOR}.{NEW}", 2),
    ([f"{ACTOR}.{NEW}=2", f"{REF}.{OLD}=4"], 2, f"{ACTOR}.{NEW}", 4),
]


@pytest.mark.parametrize("overrides, actor_sp, actor_key, ref_sp", SPELLINGS, ids=[" ".join(o) or "default"
                                                                                for o, *_ in SPELLINGS])
def test_helper_reads_the_size_verl_resolves(overrides, actor_sp, actor_key, ref_sp, monkeypatch):
    config = config_for_verl(*BASE, *overrides)
    assert verl_sp_sizes(config_for_verl(*BASE, *overrides)) == (actor_sp, ref_sp)  # the expectation is verl's
    assert role_sp_size(config.actor_rollout_ref.actor, ACTOR) == (actor_sp, actor_key)
    assert role_sp_size(config.actor_rollout_ref.ref, REF)[0] == ref_sp
    for role, prefix, sp in ((config.actor_rollout_ref.actor, ACTOR, actor_sp), (config.actor_rollout_ref.ref, REF,
                                                                                  ref_sp)):
        assert data_parallel_size(WORLD, role, prefix) == verl_dp_size(sp, monkeypatch) == WORLD // sp


def test_two_different_spellings_are_refused_naming_both_keys():
    overrides = [f"{ACTOR}.{NEW}=2", f"{ACTOR}.{OLD}=4"]
    assert verl_sp_sizes(config_for_verl(*BASE, *overrides))[0] == 4  # what verl would do: the deprecated key wins
    config = recipe_config(*BASE, *overrides)
    with pytest.raises(STAPOConfigError) as error:
        validate_run_config(config)
    assert str(error.value).startswith(f"{ACTOR}.{NEW} (2) and the deprecated {ACTOR}.{OLD} (4) disagree")
    assert "\n" not in str(error.value)


def test_batch_check_uses_dp_2_for_sp_2_on_4_ranks():
    """tiny: 4 prompts x 8 responses a step, one mini-batch: 32 responses, 16 a rank at DP 2 and 8 at DP 4. A
    micro-batch of 16 fits DP 2 only, so the check passes with SP 2 (either spelling) and fails without."""
    micro16 = (f"{ACTOR}.ppo_micro_batch_size_per_gpu=16", f"{ROLLOUT}.log_prob_micro_batch_size_per_gpu=16",
               f"{REF}.log_prob_micro_batch_size_per_gpu=16")
    for spelling in ([f"{ACTOR}.{NEW}=2", f"{REF}.{NEW}=2"], [f"{ACTOR}.{OLD}=2"]):  # the ref follows OLD itself
        validate_run_config(recipe_config(*BASE, *micro16, *spelling))
    with pytest.raises(STAPOConfigError, match=r"one mini-batch on one rank \(.* = 8\)"):
        validate_run_config(recipe_config(*BASE, *micro16))
    # the ref keeps SP 1 (DP 4) when only the actor's fsdp_config key is set: its micro-batch of 16 is refused
    ref_refused = rf"^{REF}.log_prob_micro_batch_size_per_gpu \(16\) must divide .* = 8\)"
    with pytest.raises(STAPOConfigError, match=ref_refused):
        validate_run_config(recipe_config(*BASE, *micro16, f"{ACTOR}.{NEW}=2"))


@pytest.mark.parametrize("overrides, message", [
    ([f"{ACTOR}.{NEW}=3"], f"trainer.nnodes * trainer.n_gpus_per_node (4) must be a multiple of {ACTOR}.{NEW} (3)"),
    ([f"{ACTOR}.{NEW}=0"], f"{ACTOR}.{NEW} must be a positive integer, got 0"),
    ([f"{ACTOR}.{NEW}=2", "actor_rollout_ref.model.use_remove_padding=false"],
     f"{ACTOR}.{NEW} (2) needs actor_rollout_ref.model.use_remove_padding=true"),
    # measured on four CPU ranks (tests/integration/sp_ranks.py): sdpa never reaches verl's all-to-all
    ([f"{ACTOR}.{NEW}=2", f"{ATTN}=sdpa"], f"{ACTOR}.{NEW} (2) needs flash-attention, got {ATTN}=sdpa"),
    ([f"{ACTOR}.{OLD}=2", f"{ATTN}=eager"], f"{ACTOR}.{OLD} (2) needs flash-attention, got {ATTN}=eager"),
    # the ref's own SP size is checked too
    ([f"{REF}.{NEW}=2", f"{ATTN}=sdpa", f"{ROLLOUT}.log_prob_micro_batch_size_per_gpu=8"],
     f"{REF}.{NEW} (2) needs flash-attention"),
])
def test_bad_sp_size_is_refused_in_one_line(overrides, message):
    with pytest.raises(STAPOConfigError) as error:
        validate_run_config(recipe_config(*BASE, *overrides))
    assert message in str(error.value) and "\n" not in str(error.value)
