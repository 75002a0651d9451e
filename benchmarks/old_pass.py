"""Yardstick for the mask: what verl's old-log-prob pass costs per token on this device.

verl's ``compute_log_prob`` (v1 trainer, ``calculate_entropy=True``) runs the actor forward over
prompt + response, then per token ``logprobs_from_logits`` and ``entropy_from_logits`` from
``verl.utils.torch_functional`` on the full-vocabulary logits. We run exactly that on a real Qwen3
network built from a config with transformers (random weights, no download):

- ``MEASURED``: Qwen3-0.6B's layer shapes and vocabulary (hidden 1024, 16/8 heads of 128,
  MLP 3072, vocabulary 151,936, tied embeddings) with 2 layers instead of 28.

The pass is timed in two parts: the network (transformer + LM head) and verl's log-prob/entropy
head ops over the logits. The batch estimate for the measured model is its per-token cost times the
batch's tokens (a lower bound for any real model: the paper's are 10-80x bigger). For Qwen3-1.7B,
the smallest model of the paper, the network part is scaled by forward FLOPs (2 x non-embedding
parameters + 2 x LM-head parameters + causal attention 4 x layers x q_dim x context, per token) at
the FLOP rate the measured network achieved here; verl's head ops do not depend on the model size
(same vocabulary) and are kept as measured.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from benchmarks.common import sync

VOCAB = 151936
MEASURED = dict(
    vocab_size=VOCAB, hidden_size=1024, intermediate_size=3072, num_hidden_layers=2,
    num_attention_heads=16, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True,
)
QWEN3_1P7B = dict(
    vocab_size=VOCAB, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
    num_attention_heads=16, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True,
)


def layer_params(cfg: dict) -> int:
    h = cfg["hidden_size"]
    q, kv = cfg["num_attention_heads"] * cfg["head_dim"], cfg["num_key_value_heads"] * cfg["head_dim"]
    attn = h * q + 2 * h * kv + q * h
    mlp = 3 * h * cfg["intermediate_size"]
    return cfg["num_hidden_layers"] * (attn + mlp)


def forward_flops(cfg: dict, context_positions: float) -> float:
    """Forward FLOPs of one token whose causal context holds ``context_positions`` positions."""
    q_dim = cfg["num_attention_heads"] * cfg["head_dim"]
    head = cfg["hidden_size"] * cfg["vocab_size"]
    return 2 * layer_params(cfg) + 2 * head + 4 * cfg["num_hidden_layers"] * q_dim * context_positions


@dataclass
class PassCost:
    model: str
    params: int
    tokens: int  # tokens of the measured sequence
    network_s_per_token: float
    head_s_per_token: float  # verl logprobs_from_logits + entropy_from_logits over the logits
    achieved_flops: float  # FLOP/s of the network part
    spread: float
    head_ops: str = "verl's `logprobs_from_logits` + `entropy_from_logits`"

    @property
    def s_per_token(self) -> float:
        return self.network_s_per_token + self.head_s_per_token


def measure(
    tokens: int = 1024, repeats: int = 3, device: torch.device | str = "cpu", cfg: dict | None = None
) -> PassCost:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    head_ops, logprobs_from_logits, entropy_from_logits = head_functions()

    cfg = dict(cfg or MEASURED)
    device = torch.device(device)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(**cfg, attn_implementation="sdpa")).to(device).eval()
    params = sum(p.numel() for p in model.parameters())
    ids = torch.randint(0, cfg["vocab_size"], (1, tokens), device=device)
    labels = torch.roll(ids, -1, dims=1).squeeze(0)
    network, head, total = [], [], []
    with torch.no_grad():
        for round_index in range(repeats + 1):
            sync(device)
            t0 = time.perf_counter()
            logits = model(input_ids=ids).logits.squeeze(0).float()
            sync(device)
            t1 = time.perf_counter()
            logprobs_from_logits(logits, labels)
            entropy_from_logits(logits)
            sync(device)
            t2 = time.perf_counter()
            del logits
            if round_index:
                network.append(t1 - t0)
                head.append(t2 - t1)
                total.append(t2 - t0)
    net = statistics.median(network)
    flops = forward_flops(cfg, (tokens + 1) / 2) * tokens
    return PassCost(
        model=f"Qwen3 {cfg['num_hidden_layers']} layers, hidden {cfg['hidden_size']}, "
        f"vocab {cfg['vocab_size']} ({params / 1e6:.0f}M)",
        params=params,
        tokens=tokens,
        network_s_per_token=net / tokens,
        head_s_per_token=statistics.median(head) / tokens,
        achieved_flops=flops / net,
        spread=(max(total) - min(total)) / statistics.median(total),
        head_ops=head_ops,
    )


def head_functions():
    """verl's head ops; where verl is not installed (the lent GPU machines have torch only), the same two
    quantities by plain torch (log_softmax + gather, logsumexp - sum softmax * logits), named as such."""
    try:
        from verl.utils.torch_functional import entropy_from_logits, logprobs_from_logits
    except ImportError:

        def logprobs_from_logits(logits, labels):
            return torch.log_softmax(logits, dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)

        def entropy_from_logits(logits):
            return torch.logsumexp(logits, dim=-1) - (torch.softmax(logits, dim=-1) * logits).sum(-1)

        return "plain torch log_softmax + entropy (verl not installed)", logprobs_from_logits, entropy_from_logits
    return PassCost.head_ops, logprobs_from_logits, entropy_from_logits


def batch_estimate(cost: PassCost, lengths: list[int], prompt_len: int) -> dict[str, float]:
    """Seconds of the old-log-prob pass over a batch: measured model, and Qwen3-1.7B by FLOPs.

    The pass runs over prompt + response tokens; the mask needs only the response's values, but
    verl's forward cannot skip the prompt.
    """
    tokens = sum(prompt_len + n for n in lengths)
    measured = cost.s_per_token * tokens
    # sum over every position of its causal context, per sequence: L (L + 1) / 2
    context_sum = sum((prompt_len + n) * (prompt_len + n + 1) / 2 for n in lengths)
    big = QWEN3_1P7B
    attention = 4 * big["num_hidden_layers"] * big["num_attention_heads"] * big["head_dim"] * context_sum
    flops_1p7b = forward_flops(big, 0) * tokens + attention
    qwen_1p7b = flops_1p7b / cost.achieved_flops + cost.head_s_per_token * tokens
    return {
        "pass_tokens": tokens,
        "measured_model_s": measured,
        "qwen3_1p7b_s": qwen_1p7b,
        "qwen3_1p7b_flops": flops_1p7b,
    }
