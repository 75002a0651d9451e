"""verl's FSDP engine with the STAPO plugin, driven directly under torchrun: the check to run on a CUDA machine.

No line of verl's engine had run on CUDA with the plugin. This script runs the part of a training step that the
plugin touches, through the real code: the plugin's ``STAPOActorWorker`` (verl's ``ActorRolloutRefWorker`` with
the mask fold) builds verl's FSDP2 engine from the recipe's config composed by Hydra from the GPU smoke preset
(``model_preset=qwen3_0p6b_smoke``: padding-free batches, dynamic batch size, gradient checkpointing, FSDP2 with
bf16 mixed precision, verl's ``use_torch_compile``) and each algo preset (STAPO, TACO, Lopti), then:

1. the old-policy pass (``compute_log_prob``), whose log-probabilities are compared with the sampler's;
2. an update (``update_actor``: the fold, then verl's mini-batch loop over several mini-batches and micro-batches
   of unequal size), whose token count must be the count the folded mask left;
3. a checkpoint save (verl's checkpoint manager), a second update, a load: the loaded weights must equal the
   saved ones bit for bit, and the update repeated after the load must repeat the second update (both run with
   deterministic algorithms and the math sdpa backend, so a non-deterministic backward cannot fail it).

Its figures (losses, grad norms, mask ratios, tokens a second, peak memory, times, device, versions) go to the
JSON file ``--out``; the exit code is 1 when a check fails. ``launch/cuda_check/README.md`` says how to run it.

Changed from the GPU preset, each because it cannot be had here or on the lent GPU machine: the model
(``stapo://tiny``, built locally: no hub), the attention (``sdpa``: flash-attn is not installed there),
the sizes (micro-batch token budget shrunk so the batch splits), and on the CPU (``--device cpu``): the device,
gloo, the project's CPU back-end (``STAPO_CPU_BACKEND=1``) and no ``torch.compile`` (its C++ build costs more
than the whole check on the suite's 2 cores). On CUDA ``torch.compile`` is on only where a C compiler is found
(Triton builds a C launcher for each kernel); without one it is off and the output and JSON say so. The responses
are sampled by the plain HF model in each process (there is no vLLM), seeded, so every rank holds the same batch
and takes its shard as verl's dispatch does.
Stand-ins (one): Ray, see ``no_ray.py``; vLLM and TransferQueue are imported as absent (the script hands the
worker TensorDicts, as verl's dispatch does after fetching them from TransferQueue).

Run: ``torchrun --standalone --nproc_per_node=N launch/cuda_check/engine_check.py --device cuda --out FILE``.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import platform
import resource
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
ALGOS = ("stapo", "taco", "lopti")
GPU_PRESET = "qwen3_0p6b_smoke"
# |rollout - engine| log-probability of the sampled tokens, (max, mean) over the batch: the engine's forward runs in
# bf16 under FSDP's mixed precision, the sampler in float32 (a bf16 logit is off by up to 2^-9 of its size; the
# tiny model's logits reach tens). Measured on the CPU (two gloo ranks, the default sizes, seeds 1 to 16; Intel(R)
# Xeon(R) Processor, 2026-12-01): bf16 max 0.13 to 0.27, mean 0.026 to 0.029 nats; fp32 (seed 1) max 5.5e-6, mean
# 1.2e-6. The limits are the worst seen times a stated margin: bf16 1.0 / 0.1 (3.7x / 3.4x), fp32 1e-4 / 1e-5 (18x /
# 8x). A sequence attending across the packed batch would be off by about the entropy (3.6 nats a token here).
LOGPROB_TOLERANCE = {"bf16": (1.0, 0.1), "fp32": (1e-4, 1e-5)}
LOGPROB_MEASURED = {"bf16": (0.27, 0.029), "fp32": (5.5e-6, 1.2e-6)}
# the update repeated after the checkpoint load vs the update after the save: both run with torch's deterministic
# algorithms, cuBLAS's deterministic workspace and the math sdpa backend (``deterministic_replay``), so they repeat
# bit for bit where every op has a deterministic kernel (the CPU: measured exact). On CUDA the check allows 1e-2 of
# a step's size: a last-bit change of one bf16 gradient moves its Adam step by about 2^-8 (4e-3) of itself, so an op
# torch has no deterministic kernel for (named in the JSON when torch warned) does not fail it, while a resume that
# lost the optimizer state or the schedule (a difference of the order of a whole step) does.
REPLAY_TOLERANCE = {"cpu": 0.0, "cuda": 1e-2}
# the C compilers torch.compile's back-ends build with (Triton's launcher on CUDA, C++ kernels on the CPU); $CC first
C_COMPILERS = ("cc", "gcc", "clang")
RATIOS = ("ratio", "fraction", "frac")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="the JSON file of figures and checks (written by rank 0)")
    parser.add_argument("--device", required=True, choices=("cuda", "cpu"))
    parser.add_argument("--algos", default=",".join(ALGOS), help=f"algo presets, comma-separated (of {ALGOS})")
    parser.add_argument("--model", default="stapo://tiny", help="a stapo:// model or a local HF folder")
    parser.add_argument("--prompts", type=int, default=8, help="prompts a step (data.train_batch_size)")
    parser.add_argument("--n", type=int, default=4, help="samples a prompt (rollout.n)")
    parser.add_argument("--mini-batches", type=int, default=4, help="PPO mini-batches a step")
    parser.add_argument("--prompt-len", default="4,12", help="prompt lengths, min,max")
    parser.add_argument("--response-len", default="2,40", help="response lengths, min,max")
    parser.add_argument("--max-token-len", type=int, default=96,
                        help="dynamic batch size: tokens a micro-batch (ppo_max_token_len_per_gpu)")
    parser.add_argument("--precision", default="bf16", choices=("bf16", "fp32"),
                        help="FSDP mixed precision param dtype (bf16: the GPU preset's, verl's default)")
    parser.add_argument("--compile", default="auto", choices=("auto", "on", "off"),
                        help="verl's use_torch_compile (auto: on for cuda where a C compiler is found, else off)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--checkpoint-dir", default=None, help="where checkpoints go (default: a temporary folder)")
    args = parser.parse_args(argv)
    args.algos = [name.strip() for name in args.algos.split(",") if name.strip()]
    unknown = sorted(set(args.algos) - set(ALGOS))
    if unknown or not args.algos:
        parser.error(f"--algos: {unknown or 'none given'}; allowed: {', '.join(ALGOS)}")
    args.prompt_len = _span(parser, "--prompt-len", args.prompt_len, 1)
    args.response_len = _span(parser, "--response-len", args.response_len, 1)
    if args.prompts % args.mini_batches:
        parser.error(f"--prompts ({args.prompts}) must be a multiple of --mini-batches ({args.mini_batches})")
    args.c_compiler = c_compiler()
    args.compile, args.compile_reason = compile_choice(args.compile, args.device, args.c_compiler)
    if args.compile is None:
        parser.error(args.compile_reason)
    return args


def c_compiler() -> str | None:
    """The C compiler torch.compile would build with: ``$CC`` when set, else the first of cc, gcc, clang on PATH."""
    named = os.environ.get("CC")
    if named:
        return shutil.which(named)
    return next((path for path in map(shutil.which, C_COMPILERS) if path), None)


def compile_choice(asked: str, device: str, compiler: str | None) -> tuple[bool | None, str]:
    """``(use torch.compile, why)``; ``None`` for ``on`` without a compiler (refused). Inductor's Triton back-end
    builds a C launcher for every kernel: on an image without a compiler each compiled call fails."""
    if asked == "off":
        return False, "off (--compile off)"
    if compiler is None:
        missing = f"no C compiler found ($CC, {', '.join(C_COMPILERS)})"
        if asked == "on":
            return None, f"--compile on: {missing}, which torch.compile needs; install one or pass --compile off"
        return False, f"off: {missing}"
    if asked == "on":
        return True, f"on (--compile on; C compiler {compiler})"
    if device == "cuda":
        return True, f"on (auto: cuda, C compiler {compiler})"
    return False, "off (auto on the CPU: inductor's C++ build costs more than the whole check)"


def _span(parser, name: str, text: str, least: int) -> tuple[int, int]:
    try:
        low, high = (int(part) for part in text.split(","))
    except ValueError:
        parser.error(f"{name}: two integers min,max, got {text!r}")
    if not least <= low <= high:
        parser.error(f"{name}: need {least} <= min <= max, got {text!r}")
    return low, high


def prepare_process(device: str) -> None:
    """Before any verl import: the Ray stub, vLLM and TransferQueue as absent, the CPU back-end on a CPU."""
    sys.path.insert(0, str(HERE))
    import no_ray

    no_ray.install()
    # None in sys.modules: `import vllm` fails at once, as on a machine without it (verl keeps such engines
    # optional); TransferQueue likewise (verl falls back to plain TensorDicts, which is what this script hands over)
    sys.modules.setdefault("vllm", None)
    sys.modules.setdefault("transfer_queue", None)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if device == "cpu":
        os.environ["STAPO_CPU_BACKEND"] = "1"  # read by the plugin when `import verl` loads it
    else:  # cuBLAS's deterministic workspace, read when its first handle is made: the replay check needs it
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    if str(REPO) not in sys.path:
        sys.path.append(str(REPO))  # the checkout's stapo when it is not installed (the entry point then is not)


# ----------------------------------------------------------------------------------------------- the batch


def sample_batch(model_dir: str, args, device) -> dict:
    """The step's batch, the same on every rank: prompts of random tokens, ``n`` responses each sampled by the
    plain HF model (float32, KV cache), cut to random lengths; GRPO advantages from random 0/1 rewards (verl's
    ``compute_grpo_outcome_advantage``). Also each sampled token's log-probability and the entropy there."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa")
    model = model.to(device).eval()
    g = torch.Generator().manual_seed(args.seed)
    special = set(tokenizer.all_special_ids)
    ordinary = torch.tensor([i for i in range(len(tokenizer)) if i not in special])
    longest = args.response_len[1]
    rows = {key: [] for key in ("prompt", "response", "logp", "entropy", "uid")}
    for uid in range(args.prompts):
        length = int(torch.randint(args.prompt_len[0], args.prompt_len[1] + 1, (), generator=g))
        prompt = ordinary[torch.randint(len(ordinary), (length,), generator=g)]
        ids, past, tokens, logps, entropies = prompt.repeat(args.n, 1).to(device), None, [], [], []
        with torch.no_grad():
            for _ in range(longest):
                out = model(input_ids=ids, past_key_values=past, use_cache=True)
                past = out.past_key_values
                log_p = torch.log_softmax(out.logits[:, -1].float(), dim=-1).cpu()
                token = torch.multinomial(log_p.exp(), 1, generator=g)
                tokens.append(token[:, 0])
                logps.append(log_p.gather(-1, token)[:, 0])
                entropies.append(-(log_p.exp() * log_p).sum(-1))
                ids = token.to(device)
        cut = torch.randint(args.response_len[0], longest + 1, (args.n,), generator=g)
        for i in range(args.n):
            k = int(cut[i])
            rows["prompt"].append(prompt)
            rows["response"].append(torch.stack(tokens, 1)[i, :k])
            rows["logp"].append(torch.stack(logps, 1)[i, :k])
            rows["entropy"].append(torch.stack(entropies, 1)[i, :k])
            rows["uid"].append(uid)
    del model, past
    total = len(rows["uid"])
    scores = (torch.rand(total, generator=g) < 0.5).float()
    lengths = torch.tensor([len(r) for r in rows["response"]])
    mask = (torch.arange(longest).unsqueeze(0) < lengths.unsqueeze(1)).float()
    rewards = torch.zeros(total, longest)
    rewards[torch.arange(total), lengths - 1] = scores
    advantages, _ = compute_grpo_outcome_advantage(rewards, mask, index=torch.tensor(rows["uid"]).numpy())
    rows["advantages"] = [advantages[i, :n].float() for i, n in enumerate(lengths.tolist())]
    rows["pad_token_id"] = tokenizer.pad_token_id
    return rows


def nested(rows):
    import torch

    return torch.nested.as_nested_tensor(list(rows), layout=torch.jagged)


def shard(rows: dict, rank: int, world: int) -> dict:
    """Rank ``rank``'s contiguous share of the rows (verl's dispatch chunks the batch by DP rank)."""
    total = len(rows["uid"])
    if total % world:
        raise SystemExit(f"--prompts x --n = {total} rows do not split over {world} ranks")
    size = total // world
    return {key: value[rank * size : (rank + 1) * size] for key, value in rows.items() if key != "pad_token_id"}


def sequence_fields(rows: dict):
    """A TensorDict of the shard as verl's agent loop stores it in TransferQueue (jagged, no padding)."""
    import torch
    from tensordict import TensorDict

    ids = [torch.cat([p, r]) for p, r in zip(rows["prompt"], rows["response"])]
    masks = [torch.ones(len(r), dtype=torch.int64) for r in rows["response"]]
    return TensorDict(
        {
            "input_ids": nested(ids),
            "position_ids": nested([torch.arange(len(x)) for x in ids]),
            "prompts": nested(rows["prompt"]),
            "responses": nested(rows["response"]),
            "response_mask": nested(masks),
            "loss_mask": nested([m.clone() for m in masks]),
        },
        batch_size=[len(ids)],
    )


# ----------------------------------------------------------------------------------------------- the worker


def compose_config(algo: str, model_dir: str, args, world: int):
    """The recipe's config (Hydra, conf/stapo_trainer.yaml) for the GPU smoke preset and ``algo``, with only
    what cannot be had here changed (module docstring)."""
    from hydra import compose, initialize_config_dir

    from stapo.config_dir import CONFIG_NAME, config_dir

    overrides = [
        f"algo={algo}",
        f"model_preset={GPU_PRESET}",
        f"trainer.device={args.device}",
        f"trainer.n_gpus_per_node={world}",
        f"data.train_batch_size={args.prompts}",
        f"actor_rollout_ref.model.path={model_dir}",
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        f"actor_rollout_ref.rollout.n={args.n}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={args.prompts // args.mini_batches}",
        f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={args.max_token_len}",
        f"actor_rollout_ref.actor.use_torch_compile={args.compile}",
        f"actor_rollout_ref.actor.fsdp_config.use_torch_compile={args.compile}",
        # a learning rate that moves the tiny model's weights visibly in one step (the resume check compares them)
        "actor_rollout_ref.actor.optim.lr=1e-3",
    ]
    if args.precision == "fp32":  # as the CPU presets (conf/model_preset/tiny.yaml); bf16 is verl's default
        overrides += [
            "actor_rollout_ref.actor.fsdp_config.dtype=float32",
            "+actor_rollout_ref.actor.fsdp_config.mixed_precision={param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}",
        ]
    with initialize_config_dir(config_dir=config_dir(), version_base=None):
        return compose(config_name=CONFIG_NAME, overrides=overrides), overrides


def build_worker(config):
    """The plugin's actor worker as verl's trainer builds it (role ``actor``: no rollout engine), with the
    STAPO trainer's loss (``STAPOTrainer._setup``)."""
    from verl.utils.config import omega_conf_to_dataclass

    from stapo.verl_plugin.training.actor_worker import STAPOActorWorker
    from stapo.verl_plugin.training.losses import STAPOLossFn

    worker = STAPOActorWorker(config.actor_rollout_ref, role="actor")
    worker.init_model()
    worker.set_loss_fn(STAPOLossFn(omega_conf_to_dataclass(config.actor_rollout_ref.actor)))
    return worker


def old_policy_pass(worker, rows: dict, config) -> tuple[dict, dict]:
    """``compute_log_prob`` as the v1 trainer calls it (``_compute_old_log_prob``); the response slices."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import response_from_nested

    data = sequence_fields(rows)
    tu.assign_non_tensor(data, calculate_entropy=True, compute_loss=False,
                         temperature=config.actor_rollout_ref.rollout.temperature)
    output = worker.compute_log_prob(data)
    old = {
        "old_log_probs": response_from_nested(output["log_probs"], data["response_mask"]),
        "entropy": response_from_nested(output["entropy"], data["response_mask"]),
    }
    return old, dict(tu.get(output, "metrics"))


def update(worker, rows: dict, old: dict, config) -> dict:
    """``update_actor`` on a fresh copy of the shard, with the keys the v1 trainer sets (``_update_actor``)."""
    from verl.utils import tensordict_utils as tu

    actor, rollout = config.actor_rollout_ref.actor, config.actor_rollout_ref.rollout
    data = sequence_fields(rows)
    data["old_log_probs"] = old["old_log_probs"].clone()
    data["entropy"] = old["entropy"].clone()
    data["advantages"] = nested(rows["advantages"])
    data["rollout_log_probs"] = nested(rows["logp"])
    mini_batch = actor.ppo_mini_batch_size * rollout.n
    tu.assign_non_tensor(
        data,
        calculate_entropy=bool(actor.calculate_entropy or actor.entropy_coeff != 0.0),
        distillation_use_topk=False,
        distillation_only=False,
        global_batch_size=mini_batch,
        mini_batch_size=mini_batch,
        epochs=actor.ppo_epochs,
        seed=actor.data_loader_seed,
        dataloader_kwargs={"shuffle": actor.shuffle},
        temperature=rollout.temperature,
    )
    output = worker.update_actor(data)
    return dict(tu.get(output, "metrics"))


def local_weights(worker) -> dict:
    """This rank's shard of every parameter (FSDP2 DTensors' local parts), copied to the CPU."""
    module = worker.actor.engine.module
    return {name: _local(p).detach().float().cpu().clone() for name, p in module.named_parameters()}


def _local(tensor):
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def max_difference(a: dict, b: dict) -> float:
    """The largest |a - b| over every parameter of every rank (all-reduced)."""
    import torch
    import torch.distributed as dist

    local = max((float((a[k] - b[k]).abs().max()) if a[k].numel() else 0.0) for k in a)
    value = torch.tensor([local], dtype=torch.float64)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)  # the default group has a gloo side for CPU tensors
    return float(value)


# ----------------------------------------------------------------------------------------------- figures


def values(metrics: dict, key: str) -> list[float]:
    """A raw worker metric as floats: verl returns a list (a value a mini-batch) or one value."""
    value = metrics.get(key)
    if value is None:
        return []
    return [float(item) for item in (value if isinstance(value, list) else [value])]


def reduced(metrics: dict) -> dict[str, float]:
    """The worker's metrics as the v1 trainer logs them (``_update_actor``: ``actor/`` prefix, verl's reduction)."""
    from verl.utils.metric.utils import reduce_metrics
    from verl.utils.py_functional import rename_dict

    return {key: float(value) for key, value in reduce_metrics(rename_dict(dict(metrics), "actor/")).items()}


def mean(items: list[float]) -> float | None:
    return sum(items) / len(items) if items else None


class Checks:
    """Named pass/fail results with the figure each one read; written to the JSON and summed in the exit code."""

    def __init__(self, rank: int):
        self.items: list[dict] = []
        self.rank = rank

    def add(self, name: str, ok: bool, **figures) -> None:
        self.items.append({"name": name, "ok": bool(ok), **figures})
        if self.rank == 0:
            print(f"[cuda_check] {'ok  ' if ok else 'FAIL'} {name} {figures}", flush=True)

    @property
    def ok(self) -> bool:
        return all(item["ok"] for item in self.items)


def synchronize(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


@contextlib.contextmanager
def timed(times: dict, name: str, device: str):
    synchronize(device)
    start = time.perf_counter()
    yield
    synchronize(device)
    times[name] = time.perf_counter() - start


@contextlib.contextmanager
def deterministic_replay(found: list[str]):
    """The two updates the replay check compares, made repeatable: torch's deterministic algorithms (warn-only: an
    op without a deterministic kernel runs, and its warning is appended to ``found``) and the math sdpa backend
    (the flash and memory-efficient backward kernels of sdpa accumulate with atomics on CUDA). cuBLAS's workspace
    is set by ``prepare_process``."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        with warnings.catch_warnings(record=True) as caught, sdpa_kernel([SDPBackend.MATH]):
            warnings.simplefilter("always")
            yield
        found += sorted({str(w.message).splitlines()[0] for w in caught if "determinis" in str(w.message)})
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])


def peak_memory_gib(device: str) -> dict:
    import torch

    host = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
    if device != "cuda":
        return {"host_peak_rss_gib": host}
    return {"host_peak_rss_gib": host, "device_max_allocated_gib": torch.cuda.max_memory_allocated() / 2**30,
            "device_max_reserved_gib": torch.cuda.max_memory_reserved() / 2**30}


# ----------------------------------------------------------------------------------------------- one algo


def check_algo(algo: str, model_dir: str, batch: dict, args, checkpoint_root: Path, checks: Checks) -> dict:
    import torch
    import torch.distributed as dist
    from verl.utils.config import omega_conf_to_dataclass

    from stapo.verl_plugin.training.losses import LOSS_TOKENS_METRIC, METRIC_PREFIX, mask_settings
    from stapo.verl_plugin.training.shard_mask import FOLDED_LOSS_TOKENS

    rank, world = dist.get_rank(), dist.get_world_size()
    config, overrides = compose_config(algo, model_dir, args, world)
    settings = mask_settings(omega_conf_to_dataclass(config.actor_rollout_ref.actor))
    rows = shard(batch, rank, world)
    tokens = {
        "shard": sum(len(p) + len(r) for p, r in zip(rows["prompt"], rows["response"])),
        "all_ranks": sum(len(p) + len(r) for p, r in zip(batch["prompt"], batch["response"])),
    }
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times: dict[str, float] = {}
    with timed(times, "init_model_s", args.device):
        worker = build_worker(config)
    with timed(times, "old_log_prob_s", args.device):
        old, infer_metrics = old_policy_pass(worker, rows, config)
    with timed(times, "update_s", args.device):
        first = update(worker, rows, old, config)

    # the old-policy pass against the sampler's own log-probabilities (another forward: padded, KV cache, fp32)
    engine_logp = torch.cat(list(old["old_log_probs"].unbind())).float()
    rollout_logp = torch.cat(rows["logp"]).float()
    diff = (engine_logp - rollout_logp).abs()
    gap = torch.tensor([float(diff.max())], dtype=torch.float64)
    dist.all_reduce(gap, op=dist.ReduceOp.MAX)
    gap_sum = torch.tensor([float(diff.sum()), float(diff.numel())], dtype=torch.float64)
    dist.all_reduce(gap_sum)
    mean_gap = float(gap_sum[0] / gap_sum[1])
    entropy = torch.cat(list(old["entropy"].unbind())).float()
    finite_old = bool(torch.isfinite(engine_logp).all() and torch.isfinite(entropy).all())
    checks.add(f"{algo}: old-policy pass finite", finite_old)
    max_limit, mean_limit = LOGPROB_TOLERANCE[args.precision]
    checks.add(f"{algo}: rollout and trainer log-probs agree", float(gap) <= max_limit and mean_gap <= mean_limit,
               max_abs_diff=float(gap), mean_abs_diff=mean_gap, limits=[max_limit, mean_limit],
               worst_measured_on_cpu=list(LOGPROB_MEASURED[args.precision]))

    losses, grad_norms = values(first, "loss"), values(first, "grad_norm")
    checks.add(f"{algo}: losses and grad norms finite", all(map(math.isfinite, losses + grad_norms))
               and bool(losses) and bool(grad_norms), losses=losses, grad_norms=grad_norms)
    logged = reduced(first)
    if settings.folded:
        # as STAPOTrainer._update_actor checks it: verl's count a mini-batch (DP-global), averaged over the
        # update, times the mini-batches, is the count the folded mask left
        counted = logged.get(LOSS_TOKENS_METRIC)
        counted = None if counted is None else round(counted * args.mini_batches)
        folded_tokens = logged.get(METRIC_PREFIX + FOLDED_LOSS_TOKENS)
        checks.add(f"{algo}: verl's token count is the folded mask's", counted is not None and folded_tokens
                   is not None and counted == round(folded_tokens), verl_tokens=counted, folded_tokens=folded_tokens)

    # checkpoint: save, move on, load; the loaded weights are the saved ones and the next update repeats
    saved = local_weights(worker)
    path = str(checkpoint_root / algo)
    with timed(times, "save_checkpoint_s", args.device):
        worker.save_checkpoint(path, global_step=1, max_ckpt_to_keep=1)
    nondeterministic: list[str] = []
    with timed(times, "second_update_s", args.device), deterministic_replay(nondeterministic):
        second = update(worker, rows, old, config)
    moved = local_weights(worker)
    with timed(times, "load_checkpoint_s", args.device):
        worker.load_checkpoint(path)
    loaded = local_weights(worker)
    with deterministic_replay(nondeterministic):
        repeated = update(worker, rows, old, config)
    again = local_weights(worker)
    step_size = max_difference(moved, saved)
    checks.add(f"{algo}: an update moves the weights", step_size > 0, max_abs_change=step_size)
    checks.add(f"{algo}: loaded weights equal the saved ones", max_difference(loaded, saved) == 0.0,
               max_abs_diff=max_difference(loaded, saved))
    replay_gap = max_difference(again, moved)
    replay_limit = REPLAY_TOLERANCE[args.device] * step_size
    loss_gap = max((abs(a - b) for a, b in zip(values(second, "loss"), values(repeated, "loss"))), default=math.inf)
    checks.add(f"{algo}: the update after the load repeats the update after the save",
               replay_gap <= replay_limit, max_abs_weight_diff=replay_gap, limit=replay_limit, max_loss_diff=loss_gap,
               exact=replay_gap == 0.0, deterministic_algorithms=True, sdpa_backend="math",
               nondeterministic_ops=sorted(set(nondeterministic)))

    update_tokens = tokens["all_ranks"] * (2 if settings.lopti else 1)  # Lopti updates over the batch twice
    figures = {
        "overrides": overrides,
        "mask": {"token_mask": settings.token_mask, "lopti": settings.lopti, "folded": settings.folded},
        "tokens": tokens,
        "loss": losses,
        "grad_norm": grad_norms,
        "second_update_loss": values(second, "loss"),
        "loss_after_load": values(repeated, "loss"),
        "stapo_metrics": {k: v for k, v in logged.items() if k.startswith(METRIC_PREFIX)},
        "mask_ratios": {k: v for k, v in logged.items() if k.startswith(METRIC_PREFIX) and k.endswith(RATIOS)},
        "actor_metrics": {k: v for k, v in logged.items() if not k.startswith(METRIC_PREFIX)},
        "old_pass": {"max_abs_logprob_diff_vs_rollout": float(gap),
                     "entropy_mean": float(entropy.mean()) if entropy.numel() else None,
                     "mean_abs_logprob_diff_vs_rollout": float(mean_gap),
                     "metrics": reduced(infer_metrics)},
        "times_s": times,
        "tokens_per_s": {"old_log_prob": tokens["all_ranks"] / times["old_log_prob_s"],
                         "update": update_tokens / times["update_s"]},
        "memory": peak_memory_gib(args.device),
        "lr": values(first, "lr"),
    }
    del worker, old
    gc.collect()
    if args.device == "cuda":
        torch.cuda.empty_cache()
    return figures


# ----------------------------------------------------------------------------------------------- main


def environment(device: str) -> dict:
    import importlib.metadata as metadata

    import torch

    def version(name: str) -> str | None:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device_name": torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu",
        "ray": "stub (launch/cuda_check/no_ray.py)",
    }
    for name in ("verl", "transformers", "tensordict", "hydra-core", "numpy", "tokenizers", "stapo"):
        info[name] = version(name)
    if device == "cuda":
        info["cudnn"] = torch.backends.cudnn.version()
        info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    return info


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    prepare_process(args.device)

    import torch
    import torch.distributed as dist
    import verl  # noqa: F401  (loads the plugin through its entry point, or below when not installed)

    import stapo.verl_plugin.entry  # noqa: F401  (registers the plugin's pieces; idempotent)
    from stapo.models.local import resolve_model_path

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device (torch.cuda.is_available() is False)")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if args.device == "cuda":
        torch.cuda.set_device(local_rank)
        backend = "cpu:gloo,cuda:nccl"
    else:
        backend = "gloo"
    dist.init_process_group(backend=backend)  # verl's worker finds it initialised and keeps it
    from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY

    checks = Checks(dist.get_rank())
    if dist.get_rank() == 0:
        print(f"[cuda_check] torch.compile {args.compile_reason}", flush=True)
    checks.add("plugin registered its loss in verl", "masked_clip" in POLICY_LOSS_REGISTRY)
    model_dir = resolve_model_path(args.model)
    started = time.perf_counter()
    with timed({}, "sample", args.device):
        batch = sample_batch(model_dir, args, f"cuda:{local_rank}" if args.device == "cuda" else "cpu")
    report = {"environment": environment(args.device), "world_size": dist.get_world_size(), "model": args.model,
              "settings": {k: v for k, v in vars(args).items() if k not in ("out",)}, "algos": {}}
    with contextlib.ExitStack() as stack:
        root = args.checkpoint_dir or stack.enter_context(tempfile.TemporaryDirectory(prefix="cuda_check-"))
        if args.checkpoint_dir is None and dist.get_world_size() > 1:
            # every rank must write into the same folder: rank 0's
            shared = [root]
            dist.broadcast_object_list(shared, src=0)
            root = shared[0]
        for algo in args.algos:
            report["algos"][algo] = check_algo(algo, model_dir, batch, args, Path(root), checks)
        dist.barrier()
    report["checks"] = checks.items
    report["ok"] = checks.ok
    report["total_s"] = time.perf_counter() - started
    if dist.get_rank() == 0:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=2, default=str) + "\n")
        print(f"[cuda_check] {'all checks passed' if checks.ok else 'CHECKS FAILED'}; figures in {args.out}",
              flush=True)
    dist.destroy_process_group()
    return 0 if checks.ok else 1


if __name__ == "__main__":
    sys.exit(main())
