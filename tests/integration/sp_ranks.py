"""DP 2 x SP 2 on four CPU ranks: verl's Ulysses path with the STAPO actor worker, the STAPO loss and mask.

``python -m tests.integration.sp_ranks`` (``make sp-check``, docs/sp-check.md) spawns four gloo ranks (no Ray, no
rollout). Each builds the STAPO actor worker (``STAPOActorWorker``, role ``actor``) from the recipe's real config
(Hydra: the tiny preset, padding-free batches, ``actor.fsdp_config.ulysses_sequence_parallel_size=2``), so verl's
own FSDP engine lays out its ``(dp, sp)`` mesh, monkey-patches the model for Ulysses, slices each packed
micro-batch over the SP pair and gathers the outputs back. Every rank then runs, as verl's trainer drives it:

1. the old-policy pass (``compute_log_prob``: log-probs and entropy) on its DP shard;
2. the update (``update_actor``): the STAPO mask folded into the shard over the DP group (``fold_shard``), then
   verl's update with the STAPO loss (``STAPOLossFn`` around verl's ``ppo_loss``), FSDP2's gradient reduction and
   the optimizer step.

Checked against a reference computed another way (one process, plain transformers, each row alone, float32):
the per-token log-probs and entropies of step 1, the mask of step 2 (rebuilt from those reference values over
the whole batch), the loss's token count against the folded mask, finite losses and gradient norms, and the
weights identical on all four ranks after the step.

What it cannot check here (no flash-attention on a CPU): verl's Ulysses all-to-all lives in
``_ulysses_flash_attention_forward``, which verl installs in place of transformers' flash-attention
forward; with ``attn_implementation=sdpa`` (the only choice on a CPU) transformers never calls it. So each SP rank
attends within its own slice of the packed sequence only, and the log-probs of tokens whose context crosses the
slice boundary differ from the reference: this script reports how many (``sp_mismatch``), and checks all the rest
(slicing, padding to a multiple of SP, the position-id gather, the output gather and unpad, the mesh, the mask,
the loss, the step). ``--sp 1`` is the control: DP 4 on the same ranks, whose log-probs and entropies must equal the
reference. The attention numerics of SP > 1 need flash-attention on CUDA, which this CPU script cannot give.
Stand-ins: none (the tiny model is built locally; no rollout engine is needed for these two passes).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import torch
import torch.multiprocessing as mp

# no verl import at module level: each spawned rank selects the CPU platform (STAPO_CPU_BACKEND) first

WORLD, SP = 4, 2
ROWS, SEED = 8, 0  # 8 responses: one PPO mini-batch, 4 a DP rank
TOL = 1e-4  # float32: the packed forward and the per-row reference sum in other orders


def make_rows(vocab: int, seed: int = SEED) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(ROWS):
        prompt = torch.randint(3, vocab, (int(torch.randint(3, 8, (1,), generator=g)),), generator=g)
        response = torch.randint(3, vocab, (int(torch.randint(4, 12, (1,), generator=g)),), generator=g)
        rows.append({"prompt": prompt, "response": response, "advantage": 1.0 if i % 3 else -1.0})
    return rows


def overrides(model_path: str, attn: str, sp: int = SP) -> list[str]:
    actor = "actor_rollout_ref.actor"
    return [
        "model_preset=tiny", f"actor_rollout_ref.model.path={model_path}",
        "actor_rollout_ref.model.use_remove_padding=true",
        f"actor_rollout_ref.model.override_config.attn_implementation={attn}",
        f"{actor}.fsdp_config.ulysses_sequence_parallel_size={sp}", f"trainer.n_gpus_per_node={WORLD}",
        f"{actor}.ppo_mini_batch_size={ROWS}", "actor_rollout_ref.rollout.n=1", f"data.train_batch_size={ROWS}",
        f"{actor}.ppo_micro_batch_size_per_gpu=2", "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
        f"{actor}.calculate_entropy=true", f"{actor}.shuffle=false",
        # a threshold low enough that the tiny model's sampled tokens fall below it: the mask silences some
        f"{actor}.policy_loss.tau_p=0.05",
    ]


def batch(rows: list[dict], extra: dict[str, list[torch.Tensor]] | None = None):
    """Worker-side TensorDict of ``rows`` as verl's v1 trainer hands it over: jagged sequences and response fields."""
    from tensordict import TensorDict

    def jagged(parts):
        return torch.nested.as_nested_tensor(parts, layout=torch.jagged)

    fields = {
        "input_ids": jagged([torch.cat([r["prompt"], r["response"]]) for r in rows]),
        "position_ids": jagged([torch.arange(len(r["prompt"]) + len(r["response"])) for r in rows]),
        "prompts": jagged([r["prompt"] for r in rows]),
        "responses": jagged([r["response"] for r in rows]),
        "response_mask": jagged([torch.ones(len(r["response"]), dtype=torch.long) for r in rows]),
        "loss_mask": jagged([torch.ones(len(r["response"]), dtype=torch.long) for r in rows]),
        "advantages": jagged([torch.full((len(r["response"]),), r["advantage"]) for r in rows]),
    }
    for key, parts in (extra or {}).items():
        fields[key] = jagged(parts)
    return TensorDict(fields, batch_size=len(rows))


def response_values(nested: torch.Tensor, rows: list[dict]) -> list[torch.Tensor]:
    """Response positions of a full-sequence output (position t predicts token t + 1)."""
    out = []
    for row, values in zip(rows, nested.unbind(), strict=True):
        p, n = len(row["prompt"]), len(row["response"])
        out.append(values[p - 1 : p - 1 + n].float())
    return out


def _rank(rank: int, port: int, model_path: str, attn: str, sp: int, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(WORLD), STAPO_CPU_BACKEND="1")
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        results[rank] = _run(rank, model_path, attn, sp)
    except Exception as error:  # reported by the parent with the rank that failed
        import traceback

        results[rank] = {"error": f"{error!r}\n{traceback.format_exc()}"}
        raise
    finally:
        dist.destroy_process_group()


def _run(rank: int, model_path: str, attn: str, sp: int) -> dict:
    import torch.distributed as dist
    import verl  # noqa: F401  (loads the plugin: the CPU platform and the CPU patches)
    from verl.utils import tensordict_utils as tu

    from stapo.verl_plugin.training.actor_worker import STAPOActorWorker
    from tests.recipe_config import config_for_verl

    config = config_for_verl(*overrides(model_path, attn, sp))
    worker = STAPOActorWorker(config.actor_rollout_ref, role="actor")
    worker.init_model()
    engine = worker.actor.engine
    dp_size, dp_rank = engine.get_data_parallel_size(), engine.get_data_parallel_rank()
    rows = make_rows(int(config_vocab(model_path)))
    shard_rows = rows[dp_rank * (ROWS // dp_size) : (dp_rank + 1) * (ROWS // dp_size)]

    old = batch(shard_rows)
    tu.assign_non_tensor(old, calculate_entropy=True, compute_loss=False, temperature=1.0)
    output = worker.compute_log_prob(old)
    collects = output is not None  # the SP pair's first rank returns the gathered output (verl collects it)
    mine = (dp_rank, *(response_values(tu.get(output, k), shard_rows) for k in ("log_probs", "entropy"))) if (
        collects) else None
    every = [None] * WORLD
    dist.all_gather_object(every, mine)  # verl's trainer stores the collected output; both SP ranks read it back
    _, log_probs, entropy = next(got for got in every if got is not None and got[0] == dp_rank)

    update = batch(shard_rows, {"old_log_probs": log_probs, "entropy": entropy})
    tu.assign_non_tensor(update, calculate_entropy=True, global_batch_size=ROWS, mini_batch_size=ROWS, epochs=1,
                         seed=1, dataloader_kwargs={"shuffle": False}, temperature=1.0, compute_loss=True)
    out = worker.update_actor(update)
    metrics = {key: _plain(value) for key, value in tu.get(out, "metrics").items()} if out is not None else {}
    folded = [m.tolist() for m in update["loss_mask"].unbind()]
    params = [p.full_tensor().detach().double().sum().item() for p in engine.module.parameters()]
    return {"dp": [dp_rank, dp_size], "sp": engine.ulysses_sequence_parallel_size, "collects": collects,
            "log_probs": [t.tolist() for t in log_probs], "entropy": [t.tolist() for t in entropy],
            "loss_mask": folded, "metrics": metrics, "params": params}


def config_vocab(model_path: str) -> int:
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(model_path).vocab_size


def _plain(value):
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value if isinstance(value, (int, float, str, bool, type(None))) else repr(value)


def reference(model_path: str) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Each row alone through plain transformers (float32, sdpa): log-probs and entropies of its response."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32, attn_implementation="sdpa").eval()
    rows, log_probs, entropies = make_rows(model.config.vocab_size), [], []
    with torch.no_grad():
        for row in rows:
            ids = torch.cat([row["prompt"], row["response"]])
            logits = model(ids.unsqueeze(0)).logits[0].double()
            p = len(row["prompt"])
            step = torch.log_softmax(logits[p - 1 : -1], dim=-1)
            log_probs.append(step.gather(-1, row["response"].unsqueeze(-1)).squeeze(-1))
            entropies.append(-(step.exp() * step).sum(-1))
    return log_probs, entropies


def check(results: dict, model_path: str, sp: int = SP) -> dict:
    """The figures and the failures (a list of lines; empty: all held)."""
    from stapo.algorithm.masks import MaskInputs, build_token_mask
    from stapo.verl_plugin.training.losses import mask_settings
    from tests.recipe_config import config_for_verl

    failures, ref_lp, ref_ent = [], *reference(model_path)
    by_dp = {}
    for rank in range(WORLD):
        got = results[rank]
        if got["sp"] != sp or got["dp"][1] != WORLD // sp:
            failures.append(f"rank {rank}: mesh dp={got['dp']} sp={got['sp']}, expected dp size {WORLD // sp}")
        by_dp.setdefault(got["dp"][0], []).append(got)
    for dp_rank, pair in sorted(by_dp.items()):
        if len(pair) != sp or sum(got["collects"] for got in pair) != 1:
            failures.append(f"DP rank {dp_rank}: {len(pair)} SP ranks, not one collecting rank among them")
    log_probs = [torch.tensor(r, dtype=torch.float64) for dp in sorted(by_dp) for r in by_dp[dp][0]["log_probs"]]
    entropy = [torch.tensor(r, dtype=torch.float64) for dp in sorted(by_dp) for r in by_dp[dp][0]["entropy"]]
    diffs = [(a - b).abs() for a, b in zip(log_probs, ref_lp, strict=True)]
    ent_diffs = [(a - b).abs() for a, b in zip(entropy, ref_ent, strict=True)]
    mismatched = int(sum(int((d > TOL).sum()) for d in diffs))
    total = sum(len(d) for d in diffs)
    # the mask: STAPO over the whole batch from the gathered old pass (what the ranks folded over their DP group)
    settings = mask_settings_from(config_for_verl, model_path, mask_settings)
    mask = torch.nn.utils.rnn.pad_sequence([torch.ones(len(r)) for r in log_probs], batch_first=True).bool()
    pad = torch.nn.utils.rnn.pad_sequence
    advantages = pad([torch.full((len(r),), 1.0 if i % 3 else -1.0) for i, r in enumerate(log_probs)], batch_first=True)
    built = build_token_mask(MaskInputs(mask, advantages, pad(log_probs, batch_first=True).float(),
                                        pad(entropy, batch_first=True).float()), settings)
    expected_silenced = int((built.drop_count & mask).sum())
    folded = [m for dp in sorted(by_dp) for m in by_dp[dp][0]["loss_mask"]]
    silenced = sum(len(m) - sum(m) for m in folded)
    if silenced != expected_silenced:
        failures.append(f"folded mask silences {silenced} tokens, the whole-batch STAPO mask {expected_silenced}")
    params = [results[rank]["params"] for rank in range(WORLD)]
    if any(p != params[0] for p in params):
        failures.append("the weights differ between ranks after the step")
    metrics = next(results[rank]["metrics"] for rank in range(WORLD) if results[rank]["collects"])
    for key in ("actor/pg_loss", "loss", "grad_norm"):
        values = metrics.get(key)
        values = values if isinstance(values, list) else [values]
        if not values or not all(isinstance(v, (int, float)) and math.isfinite(v) for v in values):
            failures.append(f"{key} is missing or not finite: {values}")
    # the loss divided by the folded mask's token count: every response token but the silenced ones
    kept = metrics.get("stapo/loss_tokens_folded")
    if kept != total - silenced or metrics.get("stapo/num_loss_tokens_expected") != kept:
        failures.append(f"the loss counted {kept} tokens, the folded mask keeps {total - silenced}")
    return {
        "log_prob_max_abs_diff": max(float(d.max()) for d in diffs),
        "entropy_max_abs_diff": max(float(d.max()) for d in ent_diffs),
        "sp_mismatch": f"{mismatched} of {total} response tokens beyond {TOL}",
        "silenced": silenced, "expected_silenced": expected_silenced,
        "metrics": {k: v for k, v in metrics.items() if "stapo" in k or "loss" in k or "grad_norm" in k},
        "failures": failures,
    }


def mask_settings_from(compose, model_path, settings_of):
    from verl.utils.config import omega_conf_to_dataclass

    return settings_of(omega_conf_to_dataclass(compose(*overrides(model_path, "sdpa")).actor_rollout_ref.actor))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sp", type=int, default=SP, choices=(1, 2, 4),
                        help="sequence-parallel size (1: the DP 4 control, whose log-probs must match the reference)")
    parser.add_argument("--out", default=None, help="write the figures as JSON here")
    args = parser.parse_args(argv)
    from stapo.models.tiny import build_tiny_model
    from tests.integration.gloo_ranks import free_port

    model_path = build_tiny_model()
    start = time.monotonic()
    results = mp.Manager().dict()
    mp.start_processes(_rank, args=(free_port(), model_path, "sdpa", args.sp, results), nprocs=WORLD,
                       start_method="spawn")
    results = dict(results)
    report = check(results, model_path, args.sp)
    worst = max(report["log_prob_max_abs_diff"], report["entropy_max_abs_diff"])
    if args.sp == 1 and worst > TOL:
        report["failures"].append(f"log-probs or entropies differ from the reference by {worst:.3g}")
    report["seconds"] = round(time.monotonic() - start, 1)
    text = json.dumps(report, indent=2, default=str)
    print(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as handle:
            handle.write(text + "\n")
    return 1 if report["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
