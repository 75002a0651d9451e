"""The Ulysses sequence-parallel (SP) size of an FSDP role, read where verl 0.9.1 reads it.

verl's FSDP engine builds its ``(dp, sp)`` device mesh from the engine config's
``ulysses_sequence_parallel_size``, i.e. ``<role>.fsdp_config.ulysses_sequence_parallel_size``
(``FSDPEngineConfig``; ``workers/engine/fsdp/transformer_impl.py``), so the data-parallel size is
``world / that``. The role's own ``<role>.ulysses_sequence_parallel_size`` is deprecated; verl still honours
it: ``FSDPActorConfig.__post_init__`` copies it over the engine's key when it is > 1, and the ref's deprecated key
follows the actor's deprecated one (``oc.select`` in verl's ``dp_ref.yaml``), not the actor's ``fsdp_config``
key. Reading only the deprecated key, as the pre-flight checks once did, took SP 1 for a run that set the
newer key and so checked the batch sizes against twice (or more) the real data-parallel size.

Both spellings set to different sizes > 1 is refused: verl would silently take the deprecated one.
"""

from __future__ import annotations

from stapo.algorithm.validation import STAPOConfigError, check_positive_int

SP_KEY = "ulysses_sequence_parallel_size"  # deprecated on the role, current on its fsdp_config
ENGINE_KEY = "fsdp_config"


def role_sp_size(role, prefix: str) -> tuple[int, str]:
    """``(SP size, the full key it came from)`` of one FSDP role config (``actor_rollout_ref.actor`` or
    ``.ref``); ``prefix`` is the role's full key, used in messages. The newer spelling is read first."""
    engine = role.get(ENGINE_KEY, None) or {}
    newer_key, older_key = f"{prefix}.{ENGINE_KEY}.{SP_KEY}", f"{prefix}.{SP_KEY}"
    newer = check_positive_int(newer_key, engine.get(SP_KEY, 1))
    older = check_positive_int(older_key, role.get(SP_KEY, 1))
    if newer > 1 and older > 1 and newer != older:
        raise STAPOConfigError(
            f"{newer_key} ({newer}) and the deprecated {older_key} ({older}) disagree: set only {newer_key} "
            "(verl 0.9.1 would silently use the deprecated one)"
        )
    if newer > 1:
        return newer, newer_key
    if older > 1:
        return older, older_key
    return 1, newer_key


def data_parallel_size(world_size: int, role, prefix: str) -> int:
    """``world_size / SP size`` of the role, as verl's FSDP engine lays out its mesh; refused when SP does not
    divide the world (verl's ``init_device_mesh`` would fail inside every worker)."""
    sp, key = role_sp_size(role, prefix)
    if world_size % sp:
        raise STAPOConfigError(
            f"trainer.nnodes * trainer.n_gpus_per_node ({world_size}) must be a multiple of {key} ({sp})"
        )
    return world_size // sp


def data_parallel_text(nnodes: int, per_node: int, role, prefix: str) -> str:
    """How the role's data-parallel size comes about, in numbers and with the SP key actually read (the newer
    ``fsdp_config`` one or the deprecated one), for the batch checks' refusals: ``4 (trainer.nnodes *
    trainer.n_gpus_per_node / <key> = 1 * 8 / 2)``."""
    sp, key = role_sp_size(role, prefix)
    world = "trainer.nnodes * trainer.n_gpus_per_node"
    if sp == 1:
        return f"{nnodes * per_node} ({world} = {nnodes} * {per_node}, no sequence parallelism)"
    return f"{nnodes * per_node // sp} ({world} / {key} = {nnodes} * {per_node} / {sp})"


# attention implementations whose forward never reaches verl's Ulysses all-to-all (it wraps flash-attention's)
NO_ULYSSES_ATTENTION = ("sdpa", "eager", "flex_attention")
ATTN_KEY = "actor_rollout_ref.model.override_config.attn_implementation"


def check_sp_model(role, prefix: str, model) -> None:
    """What SP > 1 needs of ``actor_rollout_ref.model``, refused here in one line instead of inside every worker
    (padding) or never (attention):

    - padding-free batches: verl's FSDP engine raises in ``FSDPEngine.__init__`` without them;
    - flash-attention: verl installs the all-to-all that gives each rank the whole sequence for its heads in
      place of transformers' flash-attention forward; sdpa or eager attention never calls it, so each rank would
      attend within its own slice of the sequence and train on wrong log-probs, silently (measured on four CPU
      ranks: docs/sp-check.md)."""
    sp, key = role_sp_size(role, prefix)
    if sp == 1:
        return
    if not bool(model.get("use_remove_padding", False)):
        raise STAPOConfigError(
            f"{key} ({sp}) needs actor_rollout_ref.model.use_remove_padding=true: verl's Ulysses sequence "
            "parallelism splits padding-free batches only"
        )
    attention = (model.get("override_config", None) or {}).get("attn_implementation", "flash_attention_2")
    if attention in NO_ULYSSES_ATTENTION:
        raise STAPOConfigError(
            f"{key} ({sp}) needs flash-attention, got {ATTN_KEY}={attention}: verl's Ulysses all-to-all runs inside "
            "flash-attention's forward only, so each rank would attend within its own slice of the sequence"
        )
