"""Cost of building the S2T mask for ``source: old`` on a whole batch of the paper's size.

The mask is built once per step on the driver from tensors verl already has, so the fair yardstick
is verl's old-log-prob pass over the same tokens. We measure the per-token forward cost of a real
small model (SmolLM2-135M, CPU) and scale it to the batch: a lower bound of that pass on this
device, since the paper's models are 12-100 times larger.
"""

from __future__ import annotations

import os
import resource
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from stapo.quantile import global_quantile, linear_quantile
from stapo.s2t import detect_spurious, s2t_diagnostics


def paper_batch(responses: int, max_len: int, seed: int = 0):
    """Padded (responses, max_len) tensors with lengths uniform in [max_len/15, max_len]."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(max_len // 15, max_len + 1, (responses,), generator=g)
    mask = torch.arange(max_len).unsqueeze(0) < lengths.unsqueeze(1)
    # most tokens confident; about 1% sampled far below tau_p (the tail S2T looks at)
    log_prob = -torch.empty(responses, max_len).exponential_(3.0, generator=g)
    tail = torch.rand(responses, max_len, generator=g) < 0.01
    log_prob[tail] = torch.empty(int(tail.sum())).uniform_(-14.0, -6.3, generator=g)
    entropy = torch.empty(responses, max_len).exponential_(1.0, generator=g)
    adv = torch.where(torch.rand(responses, generator=g) < 0.5, 1.0, -1.0).unsqueeze(1).expand(-1, max_len)
    return log_prob, entropy, adv, mask


def time_mask(responses: int, max_len: int, repeats: int = 3) -> dict:
    log_prob, entropy, adv, mask = paper_batch(responses, max_len)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        detection = detect_spurious(log_prob, entropy, adv, mask)
        s2t_diagnostics(detection, log_prob, entropy, adv, mask, 0.002)
        samples.append(time.perf_counter() - start)
    peak_delta = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) * 1024
    return {
        "tokens": int(mask.sum()),
        "padded": responses * max_len,
        "candidates": detection.num_candidates,
        "seconds": statistics.median(samples),
        "peak_rss_delta_bytes": peak_delta,
        "input_bytes": sum(t.element_size() * t.numel() for t in (log_prob, entropy, mask)),
    }


def forward_seconds_per_token(model_path: str, tokens: int = 2048) -> float:
    """Median forward time per token of an HF causal LM (log-probs and entropy need this pass)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    ids = torch.randint(0, model.config.vocab_size, (1, tokens))
    samples = []
    with torch.no_grad():
        for _ in range(3):
            start = time.perf_counter()
            logits = model(input_ids=ids).logits
            log_probs = torch.log_softmax(logits.float(), -1)
            (-(log_probs.exp() * log_probs).sum(-1)).sum()
            samples.append(time.perf_counter() - start)
    return statistics.median(samples) / tokens


def _quantile_worker(rank, world, port, per_rank, results):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    values = torch.rand(per_rank, generator=torch.Generator().manual_seed(rank))
    samples, local = [], []
    for _ in range(5):
        dist.barrier()
        start = time.perf_counter()
        global_quantile(values, 0.75, dist.group.WORLD)
        samples.append(time.perf_counter() - start)
        start = time.perf_counter()
        linear_quantile(values, 0.75)
        local.append(time.perf_counter() - start)
    results[rank] = (statistics.median(samples), statistics.median(local))
    dist.destroy_process_group()


def time_dp_quantile(world: int, per_rank: int) -> dict:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    manager = mp.Manager()
    results = manager.dict()
    mp.start_processes(_quantile_worker, args=(world, port, per_rank, results), nprocs=world, start_method="spawn")
    global_s, local_s = results[0]
    return {"world": world, "per_rank": per_rank, "global_seconds": global_s, "local_seconds": local_s}
