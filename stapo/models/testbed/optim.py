"""AdamW with a larger learning rate for the norm gains, for RL on the testbed model.

Adam moves every weight by about ``lr`` a step whatever its size. The testbed's weight matrices are
small (mean |w| ~0.017, barely moved from their init) and sharp along the policy gradient: one
fresh-Adam step at lr 1e-4 takes the held-out greedy pass rate from 0.96 to 0.20, an update of the
attention matrices alone at 3e-4 to 0.05, while the same step with random signs changes nothing. The
norm gains (~1.0, one scalar per channel) are what RL most needs to move: the sampled pass rate is
set by how sharp the output distribution is (held-out T=1 0.30, T=0.9 0.46, T=0.8 0.66), and the
final norm's gain scales the logits (the embeddings are tied). At an lr the matrices survive
(1e-5), 100 steps move a gain of 1.0 by at most 1e-3: nothing shows. This optimizer gives the 1-D
tensors (every RMSNorm gain) ``gain_lr_scale`` times the learning rate, and no weight decay, as
layer-wise optimizers such as LAMB/LARS and Adafactor's parameter scaling make steps relative to a
tensor's size.

verl builds it from ``actor_rollout_ref.actor.optim``::

    optimizer_impl: stapo.models.testbed.optim
    optimizer: GainAdamW
    override_optimizer_config: {gain_lr_scale: 100}

It takes the flat parameter iterable verl passes (FSDP2 DTensors keep their global ``ndim``); the
matrices form the first parameter group, so verl's logged ``actor/lr`` is theirs, and its warm-up
and schedule scale both groups alike (``LambdaLR`` multiplies each group's own initial lr).
"""

from __future__ import annotations

import torch


class GainAdamW(torch.optim.AdamW):
    def __init__(self, params, lr: float = 1e-3, weight_decay: float = 1e-2, gain_lr_scale: float = 1.0, **kwargs):
        params = list(params)
        if params and isinstance(params[0], dict):
            raise ValueError("GainAdamW splits a flat parameter list itself; got parameter groups")
        if not gain_lr_scale > 0:
            raise ValueError(f"gain_lr_scale must be positive, got {gain_lr_scale}")
        if any(type(p).__name__ == "FlatParameter" for p in params):
            # FSDP1 flattens every parameter to 1-D: each would be taken for a gain (stapo check refuses it too)
            raise ValueError("GainAdamW needs FSDP2 (actor.strategy=fsdp2); FSDP1's flat parameters are all 1-D")
        matrices = [p for p in params if p.ndim >= 2]
        gains = [p for p in params if p.ndim < 2]
        groups = [{"params": matrices, "lr": lr, "weight_decay": weight_decay}]
        if gains:
            groups.append({"params": gains, "lr": lr * gain_lr_scale, "weight_decay": 0.0})
        super().__init__(groups, lr=lr, weight_decay=weight_decay, **kwargs)
