"""A weighted entry's weights reach verl's real loss through the real fold and verl's real batch splits.

A tiny causal model (float64) samples nothing: its old-policy pass gives each response token's log-prob and
entropy, as verl's stores them (jagged, response-only). The STAPO actor worker's fold
(``shard_mask.fold_shard``) runs on that shard; verl's own mini-batch iterator (``tensordict_utils.make_iterator``,
shuffled) and micro-batch split (``engine.utils.prepare_micro_batches`` with dynamic batch size, which regroups
the rows) then cut it as verl's FSDP engine does, and each micro-batch goes through the production loss
(``STAPOLossFn`` -> verl's ``ppo_loss`` -> ``masked_clip``) and ``backward`` into the model. What verl's engine
adds around this (FSDP, the optimizer) does not touch the rows.

The reference is independent: per mini-batch, the loop objective of tests/reference.py with the loop weights,
its gradient per token chained through the model by autograd. The parameter gradient of each mini-batch must
equal it, for ``taco``, ``advrew`` and ``none`` (whose gradient the weights must change). Seconds, no Ray.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from tensordict import TensorDict
from verl.utils import tensordict_utils as tu
from verl.workers.engine.utils import prepare_micro_batches

from stapo.algorithm.masks import MaskSettings
from stapo.verl_plugin.training.jagged import TOKEN_WEIGHT
from stapo.verl_plugin.training.losses import IN_LOSS_PREFIX, STAPOLossFn, folded_mask_update
from stapo.verl_plugin.training.shard_mask import fold_shard
from tests.integration.test_verl_loss_path import ragged_rows, random_batch
from tests.integration.verl_batches import actor_config, fold_as_trainer, run_micro_batches
from tests.reference import REFERENCES, reference_masked_loss

VOCAB, DIM, ROWS, MINI = 13, 8, 12, 6


class TinyLM(torch.nn.Module):
    """Each position's next-token distribution from its own token: a real softmax policy, no context."""

    def __init__(self, sharpness: float):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, DIM)
        self.head = torch.nn.Linear(DIM, VOCAB)
        self.sharpness = sharpness  # peaked distributions: some sampled tokens sit far in their tail

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each position's log-prob of the next token and entropy, in verl's layout (the last position 0)."""
        logits = self.head(torch.tanh(self.embed(ids[:-1]))) * self.sharpness
        logp = torch.log_softmax(logits, dim=-1)
        chosen = logp.gather(-1, ids[1:].unsqueeze(-1)).squeeze(-1)
        entropy = -(logp.exp() * logp).sum(-1)
        zero = chosen.new_zeros(1)
        return torch.cat([chosen, zero]), torch.cat([entropy, zero])


def _nested(rows):
    return torch.nested.as_nested_tensor(rows, layout=torch.jagged)


def _shard(model: TinyLM, seed: int) -> tuple[TensorDict, dict]:
    """A rank's shard as verl's v1 trainer hands it to update_actor, and its rows as lists for the reference."""
    g = torch.Generator().manual_seed(seed)
    rows = {key: [] for key in ("ids", "prompt", "old", "entropy", "adv")}
    for row in range(ROWS):
        prompt, response = int(torch.randint(2, 5, (), generator=g)), int(torch.randint(3, 14, (), generator=g))
        ids = torch.randint(0, VOCAB, (prompt + response,), generator=g)
        with torch.no_grad():
            log_prob, entropy = model(ids)
        advantage = [0.0, 1.0, -0.7, 0.4][row % 4] * (1.0 + float(torch.rand((), generator=g)))
        rows["ids"].append(ids)
        rows["prompt"].append(prompt)
        rows["old"].append(log_prob[prompt - 1 : prompt - 1 + response])
        rows["entropy"].append(entropy[prompt - 1 : prompt - 1 + response])
        rows["adv"].append(torch.full((response,), advantage, dtype=torch.float64))
    masks = [torch.ones(len(old), dtype=torch.int64) for old in rows["old"]]
    data = TensorDict(
        {
            "input_ids": _nested(rows["ids"]),
            "prompts": _nested([ids[:p] for ids, p in zip(rows["ids"], rows["prompt"])]),
            "responses": _nested([ids[p:] for ids, p in zip(rows["ids"], rows["prompt"])]),
            "response_mask": _nested(masks),
            "loss_mask": _nested([m.clone() for m in masks]),
            "old_log_probs": _nested(rows["old"]),
            "entropy": _nested(rows["entropy"]),
            "advantages": _nested(rows["adv"]),
        },
        batch_size=ROWS,
    )
    return data, rows


def _reference_gradient(model: TinyLM, rows: dict, members: list[int], settings: MaskSettings) -> list[torch.Tensor]:
    """d/d theta of the loop objective of one mini-batch (rows ``members``): the entry's loop weights, the loop
    loss's gradient per token, chained through the model by autograd."""
    pick = {key: [rows[key][i] for i in members] for key in ("old", "entropy", "adv")}
    lists = {
        "response_mask": [[True] * len(old) for old in pick["old"]],
        "advantages": [adv.tolist() for adv in pick["adv"]],
        # the fold reads the old pass in float32, as the trainer hands it over
        "log_prob": [old.float().tolist() for old in pick["old"]],
        "entropy": [ent.float().tolist() for ent in pick["entropy"]],
    }
    expected = REFERENCES[settings.token_mask](lists, dataclasses.asdict(settings))
    new = []
    for i in members:
        log_prob, _ = model(rows["ids"][i])
        p, n = rows["prompt"][i], len(rows["old"][i])
        new.append(log_prob[p - 1 : p - 1 + n])
    tokens = sum(len(x) for x in new)
    _, grad = reference_masked_loss(
        [old.tolist() for old in pick["old"]], [x.tolist() for x in new], lists["advantages"],
        lists["response_mask"], tokens, weights=expected["weight"],
    )
    surrogate = sum((torch.tensor(g, dtype=torch.float64) * x).sum() for g, x in zip(grad, new))
    model.zero_grad()
    surrogate.backward()
    return [p.grad.clone() for p in model.parameters()]


def _update_gradients(model: TinyLM, data: TensorDict, settings: MaskSettings) -> list[tuple[list[int], list]]:
    """verl's mini- and micro-batch loop over the folded shard (no optimizer step): per mini-batch, its rows
    and the parameter gradient the production loss gave."""
    loss_fn = STAPOLossFn(actor_config(token_mask=settings.token_mask))
    data["row"] = torch.arange(ROWS)
    out = []
    mini_batches = tu.make_iterator(data, mini_batch_size=MINI, epochs=1, seed=3, dataloader_kwargs={"shuffle": True})
    for mini in mini_batches:
        tokens = int(mini["loss_mask"].values().sum())  # verl's engine: the mini-batch's count, from loss_mask
        tu.assign_non_tensor(mini, batch_num_tokens=tokens, dp_size=1, global_batch_size=MINI,
                             use_dynamic_bsz=True, max_token_len_per_gpu=40)
        micro_batches, _ = prepare_micro_batches(mini, dp_group=None)
        assert len(micro_batches) > 1  # the split really regroups the rows
        model.zero_grad()
        for micro in micro_batches:
            assert (TOKEN_WEIGHT in micro.keys()) == (settings.token_mask != "none")
            pieces = [model(ids)[0] for ids in micro["input_ids"].unbind()]
            offsets = torch.cat([torch.zeros(1, dtype=torch.long), micro["input_ids"].offsets().diff().cumsum(0)])
            model_output = {"log_probs": torch.nested.nested_tensor_from_jagged(torch.cat(pieces), offsets)}
            with folded_mask_update():
                loss, _ = loss_fn(model_output=model_output, data=micro, dp_group=None)
            loss.backward()
        out.append((mini["row"].tolist(), [p.grad.clone() for p in model.parameters()]))
    return out


@pytest.mark.parametrize("name", ["taco", "advrew", "none"])
def test_the_folded_weight_reaches_verls_loss_through_verls_splits(name):
    torch.manual_seed(0)
    model = TinyLM(sharpness=6.0).double()
    data, rows = _shard(model, seed=1)
    settings = MaskSettings(token_mask=name)
    metrics = fold_shard(data, settings)
    if name != "none":
        assert 0 < metrics["num_downweighted"] and metrics["min_weight"] < 0.75  # the weights change the objective
    with torch.no_grad():  # the update's policy moved from the old one: ratios off 1, some clipped
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    for members, grads in _update_gradients(model, data, settings):
        want = _reference_gradient(model, rows, members, settings)
        for got, expected in zip(grads, want):
            assert torch.allclose(got, expected, rtol=1e-5, atol=1e-9), (name, members)
        if name != "none":
            plain = _reference_gradient(model, rows, members, MaskSettings(token_mask="none"))
            assert any(not torch.allclose(g, p, rtol=1e-3, atol=1e-6) for g, p in zip(grads, plain))


# --- the loss's other inputs: verl's rollout weights, the in-loss build, the refusals ----------------------------


def _folded_rows(name: str, seed: int):
    tensors, lengths, prompt_lens = random_batch(seed)
    response_mask, loss_mask, built = fold_as_trainer(tensors, MaskSettings(token_mask=name))
    rows = ragged_rows(tensors, lengths, response_mask, loss_mask, built.weight)
    return tensors, lengths, prompt_lens, rows, built


@pytest.mark.parametrize("name", ["taco", "advrew"])
def test_the_weight_and_verls_rollout_weights_multiply(name):
    tensors, lengths, prompt_lens, rows, built = _folded_rows(name, seed=5)
    g = torch.Generator().manual_seed(8)
    rollout = 0.5 + torch.rand(tensors["log_prob"].shape, generator=g, dtype=torch.float64)
    rows["rollout_is_weights"] = [rollout[i, :n] for i, n in enumerate(lengths)]
    tokens = int(tensors["response_mask"].sum())
    total, grads, _ = run_micro_batches(STAPOLossFn(actor_config(token_mask=name)), rows, prompt_lens, [4, 6], tokens)
    lists = {key: value.tolist() for key, value in tensors.items()}
    lists["log_prob"] = lists["old_log_prob"]
    weight = REFERENCES[name](lists, dataclasses.asdict(MaskSettings(token_mask=name)))["weight"]
    product = [[w * float(r) for w, r in zip(wr, rr)] for wr, rr in zip(weight, rollout)]
    want, want_grad = reference_masked_loss(
        lists["old_log_prob"], tensors["log_prob"].tolist(), lists["advantages"], lists["response_mask"], tokens,
        weights=product,
    )
    assert total == pytest.approx(want, rel=1e-10)
    for row, (got, expected) in enumerate(zip(grads, want_grad)):
        assert got == pytest.approx(expected[: lengths[row]], rel=1e-9, abs=1e-15), row


@pytest.mark.parametrize("name", ["taco", "advrew"])
def test_source_current_weights_from_the_update_forward(name):
    """Built inside the loss from the update's own (detached) log-probs and entropy; nothing dropped, so the
    micro-batch keeps verl's count and the weights are all that changes."""
    tensors, lengths, prompt_lens = random_batch(6)
    mask = tensors["response_mask"]
    rows = ragged_rows(tensors, lengths, mask, mask)
    tokens = int(mask.sum())
    loss_fn = STAPOLossFn(actor_config(token_mask=name, source="current"))
    total, grads, metrics = run_micro_batches(loss_fn, rows, prompt_lens, [3, 7], tokens)
    lists = {key: value.tolist() for key, value in tensors.items()}
    lists["entropy"] = tensors["model_entropy"].double().tolist()  # the forward's float32 entropy
    weight = REFERENCES[name](lists, dataclasses.asdict(MaskSettings(token_mask=name)))["weight"]
    want, want_grad = reference_masked_loss(
        lists["old_log_prob"], lists["log_prob"], lists["advantages"], lists["response_mask"], tokens, weights=weight
    )
    assert total == pytest.approx(want, rel=1e-10)
    for row, (got, expected) in enumerate(zip(grads, want_grad)):
        assert got == pytest.approx(expected[: lengths[row]], rel=1e-9, abs=1e-15), row
    downweighted = sum(float(m[IN_LOSS_PREFIX + "num_downweighted"].values[0]) for m in metrics)
    assert downweighted == sum(w < 1 for wr, mr in zip(weight, lists["response_mask"]) for w, m in zip(wr, mr) if m)
    assert downweighted > 0


def test_a_weighted_mask_whose_weights_are_missing_or_ignored_is_refused():
    """Without the field the update would train the unweighted objective under the entry's name; with a loss
    that does not read it, the weights would be ignored: both refuse in the first micro-batch."""
    tensors, lengths, prompt_lens, rows, _ = _folded_rows("taco", seed=2)
    tokens = int(tensors["response_mask"].sum())
    lost = {key: value for key, value in rows.items() if key != TOKEN_WEIGHT}
    with pytest.raises(RuntimeError, match="token_mask=taco weights each token's loss, but this micro-batch"):
        run_micro_batches(STAPOLossFn(actor_config(token_mask="taco")), lost, prompt_lens, [10], tokens)
    ignored = STAPOLossFn(actor_config(token_mask="taco", loss_mode="vanilla"))
    with pytest.raises(RuntimeError, match=r"only policy_loss\.loss_mode=masked_clip applies \(got 'vanilla'\)"):
        run_micro_batches(ignored, rows, prompt_lens, [10], tokens)
