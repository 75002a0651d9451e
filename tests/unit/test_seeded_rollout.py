"""The HF rollout's seeded sampling, its prompt groups, the per-request seeds and the batch order (no trainer).

A small random Qwen3 model stands in for a checkpoint; references are HF's own logits warpers and
a loop that recomputes the whole sequence without a KV cache.
"""

from __future__ import annotations

import asyncio

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from stapo.verl_plugin.cpu.sampling import Sampling, filter_logits, sample_batch, sample_group
from stapo.verl_plugin.reproducible.seeding import request_seed, seed_for_request

EOS = 1


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=128,
        eos_token_id=EOS,
        pad_token_id=0,
    )
    folder = tmp_path_factory.mktemp("qwen3_small")
    Qwen3ForCausalLM(config).save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def server(model_dir):
    from stapo.verl_plugin.cpu.rollout import HFGenerationServer

    return HFGenerationServer(model_dir, response_length=12, prompt_length=16, threads=3)


@pytest.mark.parametrize("temperature, top_k, top_p", [(1.0, 0, 1.0), (0.7, 5, 1.0), (1.3, 0, 0.8), (0.9, 20, 0.6)])
def test_filter_matches_hf_warpers(temperature, top_k, top_p):
    torch.manual_seed(1)
    logits = torch.randn(96) * 3
    expected = TemperatureLogitsWarper(temperature)(None, logits[None].clone())
    if top_k:
        expected = TopKLogitsWarper(top_k)(None, expected)
    if top_p < 1:
        expected = TopPLogitsWarper(top_p)(None, expected)
    got = filter_logits(logits, Sampling(temperature=temperature, top_k=top_k, top_p=top_p))
    assert torch.equal(torch.isinf(got), torch.isinf(expected[0]))
    assert torch.allclose(got[~torch.isinf(got)], expected[0][~torch.isinf(got)])


def test_kv_cache_loop_matches_full_recompute(model_dir):
    model = Qwen3ForCausalLM.from_pretrained(model_dir).eval()
    sampling = Sampling(temperature=1.0, top_k=30, max_tokens=10, logprobs=True)
    tokens, log_probs, _, _ = sample_group(model, [5, 6, 7, 8], sampling, seeds=[123], eos_ids=[EOS])[0]
    generator = torch.Generator().manual_seed(123)
    sequence, expected = [5, 6, 7, 8], []
    with torch.no_grad():
        for _ in range(len(tokens)):
            logits = model(torch.tensor([sequence])).logits[0, -1]
            probs = torch.softmax(TopKLogitsWarper(30)(None, logits[None].clone())[0], dim=-1)
            token = int(torch.multinomial(probs, 1, generator=generator))
            expected.append(float(torch.log_softmax(logits, -1)[token]))
            sequence.append(token)
    assert tokens == sequence[4:]
    assert log_probs == pytest.approx(expected, abs=1e-5)


@pytest.mark.parametrize("unused_from", [None, 60])
def test_token_stats_are_those_of_the_distribution_the_log_probs_come_from(model_dir, unused_from):
    """Each sampled position's collision probability and mass on ids >= ``unused_from``, against the softmax
    of a full recompute without KV cache (float64), at the rollout temperature; the sampled unused ids counted."""
    model = Qwen3ForCausalLM.from_pretrained(model_dir).eval()
    prompt, temperature = [5, 6, 7, 8], 0.8
    sampling = Sampling(temperature=temperature, max_tokens=10, logprobs=True)
    rows = sample_batch(model, [prompt, prompt[1:]], sampling, [11, 12], [EOS], unused_from=unused_from)
    for row_prompt, (tokens, _, _, stats) in zip([prompt, prompt[1:]], rows):
        with torch.no_grad():
            logits = model(torch.tensor([row_prompt + tokens])).logits[0, len(row_prompt) - 1 : -1].double()
        probs = torch.softmax(logits / temperature, dim=-1)
        assert stats["collision"] == pytest.approx([float((row ** 2).sum()) for row in probs], rel=1e-4)
        if unused_from is None:
            assert set(stats) == {"collision"}
            continue
        assert stats["unused_mass"] == pytest.approx([float(row[unused_from:].sum()) for row in probs], rel=1e-4)
        assert stats["unused_sampled"] == sum(token >= unused_from for token in tokens)
    assert sample_batch(model, [prompt], Sampling(max_tokens=4), [3], [EOS], unused_from)[0][3] is None


def test_the_server_returns_token_stats_with_log_probs(server):
    out = asyncio.run(_generate(server, [3, 4, 5, 6], 5))
    stats = out.extra_fields["stapo_token_stats"]
    assert len(stats["collision"]) == len(out.token_ids) > 0 and all(0 < c <= 1 for c in stats["collision"])


@pytest.mark.parametrize("temperature", [0.7, 1.3])
def test_log_probs_are_the_actors_at_the_rollout_temperature(model_dir, temperature):
    """verl's actor scales its logits by the rollout temperature before its log-probs (its FSDP engine's
    ``_scale_logits_by_temperature`` and ``logprobs_from_logits``): the rollout's must be the same quantity,
    or verl's rollout-vs-actor metrics and rollout correction weights compare different things. top-k
    filters what is drawn, not the log-prob."""
    from verl.utils.torch_functional import logprobs_from_logits
    from verl.workers.engine.fsdp.transformer_impl import _scale_logits_by_temperature

    model = Qwen3ForCausalLM.from_pretrained(model_dir).eval()
    prompt = [5, 6, 7, 8]
    sampling = Sampling(temperature=temperature, top_k=30, max_tokens=10, logprobs=True)
    tokens, log_probs, _, _ = sample_group(model, prompt, sampling, seeds=[321], eos_ids=[EOS])[0]
    sequence = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logits = model(sequence).logits[0, len(prompt) - 1 : -1]
        scaled = _scale_logits_by_temperature(logits, torch.tensor(temperature), is_unit_temperature=False)
        actor = logprobs_from_logits(scaled, sequence[0, len(prompt) :], inplace_backward=False)
        untempered = torch.log_softmax(logits, dim=-1).gather(-1, sequence[0, len(prompt) :, None])[:, 0]
    assert log_probs == pytest.approx(actor.tolist(), abs=1e-5)
    assert log_probs != pytest.approx(untempered.tolist(), abs=1e-3)


def _generate(server, prompt, seed, temperature=1.0):
    params = {"temperature": temperature, "top_p": 1.0, "top_k": -1, "logprobs": True}
    if seed is not None:
        params["seed"] = seed
    return server.generate("r", prompt_ids=prompt, sampling_params=params)


def test_same_seed_same_tokens_whatever_else_is_in_flight(server):
    prompt, seed = [3, 4, 5, 6, 7], request_seed(1, 1, "p", "s0")

    async def alone():
        return await _generate(server, prompt, seed)

    async def crowded():
        others = [_generate(server, [9, 10 + i, 11] * (i + 1), request_seed(1, 1, f"q{i}", "s0")) for i in range(5)]
        results = await asyncio.gather(*others[:3], _generate(server, prompt, seed), *others[3:])
        return results[3]

    first, second = asyncio.run(alone()), asyncio.run(crowded())
    assert first.token_ids == second.token_ids and first.log_probs == second.log_probs
    assert len(first.log_probs) == len(first.token_ids) > 0


def test_other_sample_index_gives_other_tokens(server):
    prompt = [3, 4, 5, 6, 7]

    async def group():
        seeds = [request_seed(1, 1, "p", f"s{i}") for i in range(4)]
        return await asyncio.gather(*[_generate(server, prompt, s) for s in seeds])

    responses = [tuple(out.token_ids) for out in asyncio.run(group())]
    assert len(set(responses)) == 4


def test_greedy_needs_no_seed_and_unseeded_sampling_still_runs(server):
    greedy = [asyncio.run(_generate(server, [3, 4, 5], None, temperature=0)).token_ids for _ in range(2)]
    assert greedy[0] == greedy[1]
    assert asyncio.run(_generate(server, [3, 4, 5], None)).token_ids  # a random seed, logged once


def test_seed_identifies_step_prompt_and_sample():
    base = {"global_steps": 3, "index": 7, "raw_prompt": [{"role": "user", "content": "1+1"}], "session_id": 0}
    seed = seed_for_request(42, base)
    assert seed == seed_for_request(42, dict(base, uid="another-uuid4"))  # the uid is random per run
    assert 0 <= seed < 2**63
    for change in (
        {"session_id": 1},
        {"global_steps": 4},
        {"index": 8},
        {"raw_prompt": [{"role": "user", "content": "1+2"}]},
    ):
        assert seed_for_request(42, dict(base, **change)) != seed, change
    assert seed_for_request(43, base) != seed
    # pinned: a seed must not change with the Python version, the machine or the process
    assert request_seed(1, 2, "k", "s3") == 559845638354300787  # blake2b-64 of [1, 2, "k", "s3"], top bit cleared
    with pytest.raises(KeyError, match="session_id or priority"):
        seed_for_request(42, {k: v for k, v in base.items() if k != "session_id"})


def _reference_row(model, prompt, seed, top_k, steps, eos_ids):
    """One sample recomputed from scratch at every step (no KV cache, no batch): the independent reference."""
    generator = torch.Generator().manual_seed(seed)
    sequence, log_probs = list(prompt), []
    with torch.no_grad():
        for _ in range(steps):
            logits = model(torch.tensor([sequence])).logits[0, -1]
            probs = torch.softmax(TopKLogitsWarper(top_k)(None, logits[None].clone())[0], dim=-1)
            token = int(torch.multinomial(probs, 1, generator=generator))
            log_probs.append(float(torch.log_softmax(logits, -1)[token]))
            sequence.append(token)
            if token in eos_ids:
                break
    return sequence[len(prompt):], log_probs


@pytest.mark.parametrize("rows", [1, 3, 8])
def test_group_rows_match_one_sample_recomputed_alone(model_dir, rows):
    model = Qwen3ForCausalLM.from_pretrained(model_dir).eval()
    eos_ids = list(range(1, 9))  # frequent stops: some rows finish while the others go on
    sampling = Sampling(temperature=1.0, top_k=30, max_tokens=10, logprobs=True)
    seeds = [request_seed(1, 1, "p", f"s{i}") for i in range(rows)]
    results = sample_group(model, [5, 6, 7, 8], sampling, seeds, eos_ids)
    assert len(results) == rows
    lengths = set()
    for seed, (tokens, log_probs, stop, _) in zip(seeds, results):
        expected_tokens, expected_log_probs = _reference_row(model, [5, 6, 7, 8], seed, 30, 10, eos_ids)
        assert tokens == expected_tokens
        assert log_probs == pytest.approx(expected_log_probs, abs=1e-5)
        assert stop == ("completed" if tokens[-1] in eos_ids else "length")
        assert all(t not in eos_ids for t in tokens[:-1])  # nothing is kept after a stop
        lengths.add(len(tokens))
    if rows == 8:
        assert len(lengths) > 1  # the case that matters: rows of different lengths in one batch


PROMPTS = ([5, 6, 7, 8], [9, 10], [11, 12, 13, 14, 15, 16, 17], [9, 10])  # three lengths, one prompt twice


def test_a_batch_of_several_prompts_matches_each_row_recomputed_alone(model_dir):
    """Left-padded prompts of three lengths in one batch: every row's tokens are the ones it samples alone without
    a KV cache, its log-probs equal to rounding, and rows of one prompt share its encoding."""
    model = Qwen3ForCausalLM.from_pretrained(model_dir).eval()
    eos_ids = list(range(1, 9))
    sampling = Sampling(temperature=1.0, top_k=30, max_tokens=10, logprobs=True)
    prompts = [list(p) for p in PROMPTS for _ in range(3)]
    seeds = [request_seed(1, 1, f"p{i}", "s0") for i in range(len(prompts))]
    results = sample_batch(model, prompts, sampling, seeds, eos_ids)
    lengths = set()
    for prompt, seed, (tokens, log_probs, stop, _) in zip(prompts, seeds, results):
        expected_tokens, expected_log_probs = _reference_row(model, prompt, seed, 30, 10, eos_ids)
        assert tokens == expected_tokens
        assert log_probs == pytest.approx(expected_log_probs, abs=1e-5)
        assert stop == ("completed" if tokens[-1] in eos_ids else "length")
        lengths.add(len(tokens))
    assert len(lengths) > 1


def test_a_batchs_rows_do_not_depend_on_their_order(model_dir):
    """The server hands rows over in arrival order's sort; what each row computes is the same in any order,
    bit for bit (the distinct prompts are encoded in sorted order whatever the rows' order)."""
    model = Qwen3ForCausalLM.from_pretrained(model_dir).eval()
    sampling = Sampling(temperature=1.0, max_tokens=8, logprobs=True)
    prompts = [list(p) for p in PROMPTS for _ in range(2)]
    seeds = [request_seed(2, 1, f"p{i}", "s0") for i in range(len(prompts))]
    forward = sample_batch(model, prompts, sampling, seeds, [EOS])
    order = list(reversed(range(len(prompts))))
    backward = sample_batch(model, [prompts[i] for i in order], sampling, [seeds[i] for i in order], [EOS])
    assert [backward[order.index(i)] for i in range(len(prompts))] == forward
    with pytest.raises(ValueError, match="one of each per row"):
        sample_batch(model, prompts, sampling, seeds[:-1], [EOS])


def _reference_batch(model, prompts, sampling, seeds, eos_ids, unused_from):
    """The same batch decoded the plain way: HF's own growing cache, every row's softmax, draw and
    statistics computed on the row alone, token after token."""
    width = max(len(p) for p in prompts)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    generators = [torch.Generator().manual_seed(s) for s in seeds]
    out = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0), use_cache=True)
    rows, done = [([], [], [], []) for _ in prompts], [False] * len(prompts)
    temperature = 1.0 if sampling.greedy else sampling.temperature
    for step in range(sampling.max_tokens):
        logits, drawn = out.logits[:, -1].float(), []
        for row, (tokens, log_probs, collisions, unused) in enumerate(rows):
            if sampling.greedy:
                token = int(torch.argmax(logits[row]))
            else:
                probs = torch.softmax(filter_logits(logits[row], sampling), dim=-1)
                token = int(torch.multinomial(probs, 1, generator=generators[row]))
            drawn.append(token)
            if done[row]:
                continue
            row_log_probs = torch.log_softmax(logits[row] / temperature, dim=-1)
            tokens.append(token)
            log_probs.append(float(row_log_probs[token]))
            collisions.append(float(row_log_probs.exp().square().sum()))
            unused.append(float(row_log_probs.exp()[unused_from:].sum()))
            done[row] = token in eos_ids
        if all(done):
            break
        mask = torch.cat([mask, torch.ones(len(prompts), 1, dtype=torch.long)], dim=-1)
        out = model(input_ids=torch.tensor(drawn)[:, None], attention_mask=mask,
                    position_ids=torch.tensor([len(p) + step for p in prompts])[:, None],
                    past_key_values=out.past_key_values, use_cache=True)
    return rows


@pytest.mark.parametrize("temperature, top_k, top_p", [(1.0, 0, 1.0), (0.7, 0, 0.9), (1.0, 20, 1.0), (0.0, 0, 1.0)])
def test_the_decode_is_the_plain_row_by_row_decode_bit_for_bit(model_dir, temperature, top_k, top_p):
    """``sample_batch`` writes the KV cache in place (``PreallocatedLayer``) and takes each step's softmaxes over
    all rows at once; neither may change a bit of what a row draws or reports, or recorded runs would not rerun."""
    model = Qwen3ForCausalLM.from_pretrained(model_dir).eval()
    sampling = Sampling(temperature=temperature, top_k=top_k, top_p=top_p, max_tokens=12, logprobs=True)
    prompts = [list(p) for p in PROMPTS for _ in range(3)]
    seeds = [request_seed(3, 1, f"p{i}", "s0") for i in range(len(prompts))]
    eos_ids = list(range(1, 6))  # rows stop at different steps
    got = sample_batch(model, prompts, sampling, seeds, eos_ids, unused_from=60)
    with torch.no_grad():
        expected = _reference_batch(model, prompts, sampling, seeds, eos_ids, unused_from=60)
    for (tokens, log_probs, _, stats), (ref_tokens, ref_log_probs, ref_collisions, ref_unused) in zip(got, expected):
        assert tokens == ref_tokens and log_probs == ref_log_probs
        assert stats["collision"] == ref_collisions and stats["unused_mass"] == ref_unused
    if temperature > 0:
        assert len({len(tokens) for tokens, *_ in got}) > 1  # rows that stopped early kept their slots


@pytest.mark.parametrize("vocab", [2, 27, 4096])
@pytest.mark.parametrize("temperature, top_k, top_p", [(1.0, 0, 1.0), (0.7, 0, 0.9), (1.0, 5, 1.0)])
def test_a_draw_of_all_rows_is_a_row_by_row_multinomial_bit_for_bit(vocab, temperature, top_k, top_p):
    """``draw_tokens`` draws every row at once by the exponential race; each row's token, and its generator's state
    after the draw, must be those of ``torch.multinomial`` on the row alone, draw after draw (recorded runs were
    sampled so). Fresh logits each time: peaked rows, flat rows, rows with exact ties, filtered-out tokens."""
    from stapo.verl_plugin.cpu.sampling import draw_tokens

    rows = 40
    sampling = Sampling(temperature=temperature, top_k=top_k, top_p=top_p)
    seeds = torch.randint(0, 2**62, (rows,)).tolist()
    batched = [torch.Generator().manual_seed(seed) for seed in seeds]
    alone = [torch.Generator().manual_seed(seed) for seed in seeds]
    for _ in range(6):
        logits = torch.randn(rows, vocab) * torch.rand(rows, 1) * 12
        logits[: rows // 4] = logits[: rows // 4].round()  # exact ties
        logits[-1] = 0.0  # a flat row
        got = draw_tokens(logits, sampling, batched)
        expected = []
        for row in range(rows):
            scores = filter_logits(logits[row], sampling) if top_k or top_p < 1 else logits[row] / temperature
            expected.append(int(torch.multinomial(torch.softmax(scores, dim=-1), 1, generator=alone[row])))
        assert got == expected
        assert all(torch.equal(a.get_state(), b.get_state()) for a, b in zip(batched, alone))
        if top_k or top_p < 1:  # never a filtered-out token
            kept = torch.stack([filter_logits(row, sampling) for row in logits]).isfinite()
            assert all(kept[row, token] for row, token in enumerate(got))


def test_a_preallocated_cache_layer_holds_what_hfs_growing_one_holds():
    from transformers.cache_utils import DynamicLayer

    from stapo.verl_plugin.cpu.sampling import PreallocatedLayer

    growing, chunks = DynamicLayer(), [torch.randn(3, 2, n, 4) for n in (5, 1, 1, 2)]
    growing.update(chunks[0], -chunks[0])
    layer = PreallocatedLayer(growing, capacity=9)
    for chunk in chunks[1:]:
        keys, values = layer.update(chunk, -chunk)
        expected_keys, expected_values = growing.update(chunk, -chunk)
        assert torch.equal(keys, expected_keys) and torch.equal(values, expected_values)
        assert layer.get_seq_length() == growing.get_seq_length()
    with pytest.raises(RuntimeError):
        layer.update(chunks[0], chunks[0])  # past its capacity


def _group_request(server, prompt, key, size, index, temperature=1.0):
    params = {
        "temperature": temperature, "top_p": 1.0, "top_k": -1, "logprobs": True,
        "seed": request_seed(1, 1, key, f"s{index}"), "stapo_group": {"key": key, "size": size, "index": index},
    }
    return server.generate(f"{key}-{index}", prompt_ids=prompt, sampling_params=params)


def test_server_generates_a_group_as_one_batch_whatever_the_arrival_order(server):
    prompt = [3, 4, 5, 6, 7]

    async def arrive(order):
        others = [_group_request(server, [9, 10, 11], "other", 2, i) for i in range(2)]
        mine = {i: _group_request(server, prompt, "mine", 4, i) for i in range(4)}
        results = await asyncio.gather(*[mine[i] for i in order], *others)
        return {i: results[k] for k, i in enumerate(order)}

    first, second = asyncio.run(arrive([0, 1, 2, 3])), asyncio.run(arrive([3, 1, 0, 2]))
    sampling = Sampling(temperature=1.0, max_tokens=12, logprobs=True)
    direct = sample_group(server.model, prompt, sampling, [request_seed(1, 1, "mine", f"s{i}") for i in range(4)],
                          server.eos_ids)
    for i in range(4):
        assert first[i].token_ids == second[i].token_ids == direct[i][0]
        assert first[i].log_probs == second[i].log_probs == direct[i][1]
    assert not server._groups  # nothing left waiting


def test_an_announced_submission_decodes_as_one_batch_whatever_the_arrival_order(server):
    """The trainer announces 3 prompts x 2 samples plus one greedy request (another sampling setting, its own
    batch); groups announced by the agent loop are taken into the submission's batch. Every request gets the
    row that sample_batch computes for the submission in batch order, whatever order the requests came in."""
    prompts = {"a": [3, 4, 5, 6, 7], "b": [9, 10], "c": [11, 12, 13]}
    requests = [(key, prompt, i) for key, prompt in prompts.items() for i in range(2)]

    async def arrive(order):
        await server.expect_batch(len(requests) + 1)
        calls = [_group_request(server, requests[k][1], requests[k][0], 2, requests[k][2]) for k in order]
        greedy = _generate(server, [3, 4, 5], None, temperature=0)
        results = await asyncio.gather(*calls[:3], greedy, *calls[3:])
        sampled = results[:3] + results[4:]
        return {order[k]: sampled[k] for k in range(len(order))}, results[3]

    (first, greedy_1), (second, greedy_2) = asyncio.run(arrive(list(range(6)))), asyncio.run(arrive([5, 2, 0, 4, 1, 3]))
    sampling = Sampling(temperature=1.0, max_tokens=12, logprobs=True)
    seeds = [request_seed(1, 1, key, f"s{i}") for key, _, i in requests]
    direct = sample_batch(server.model, [prompt for _, prompt, _ in requests], sampling, seeds, server.eos_ids)
    for k in range(len(requests)):
        assert first[k].token_ids == second[k].token_ids == direct[k][0]
        assert first[k].log_probs == second[k].log_probs == direct[k][1]
    assert greedy_1.token_ids == greedy_2.token_ids
    assert not server._batches and not server._groups  # nothing left waiting


def test_a_row_is_handed_over_at_the_step_it_ends(model_dir):
    """``on_row_done`` gets each row that ends with an end-of-sequence token once, with its final result, at the step
    it ends (so in the order of the rows' lengths, not of their indices); rows cut at ``max_tokens`` are only
    returned."""
    model = Qwen3ForCausalLM.from_pretrained(model_dir).eval()
    sampling = Sampling(temperature=1.0, max_tokens=12, logprobs=True)
    prompts = [list(p) for p in PROMPTS for _ in range(4)]
    seeds = [request_seed(5, 1, f"p{i}", "s0") for i in range(len(prompts))]
    handed: list[tuple[int, tuple]] = []
    results = sample_batch(model, prompts, sampling, seeds, list(range(1, 9)),
                           on_row_done=lambda row, result: handed.append((row, (list(result[0]),) + result[1:])))
    ended = [row for row, (_, _, stop, _) in enumerate(results) if stop == "completed"]
    assert sorted(row for row, _ in handed) == ended and 1 < len(ended) < len(prompts)
    assert all(result == results[row] for row, result in handed)
    lengths = [len(result[0]) for _, result in handed]
    assert lengths == sorted(lengths) and [row for row, _ in handed] != sorted(row for row, _ in handed)


def test_a_submissions_early_rows_are_answered_before_the_batch_ends(model_dir):
    """The server answers each request of an announced submission when its row ends, while the batch decodes on
    (the agent loop post-processes it meanwhile): requests complete in the order of their rows' lengths, the
    rows cut at ``max_tokens`` last, with the tokens the batch computes."""
    from stapo.verl_plugin.cpu.rollout import HFGenerationServer

    server = HFGenerationServer(model_dir, response_length=12, prompt_length=16, threads=1)
    server.eos_ids = list(range(1, 9))  # more end tokens than the random model's one, so rows end at many steps
    prompts = [list(p) for p in PROMPTS for _ in range(4)]

    async def submit():
        await server.expect_batch(len(prompts))
        completed: list[int] = []
        tasks = [asyncio.ensure_future(_generate(server, prompt, request_seed(6, 1, f"p{i}", "s0")))
                 for i, prompt in enumerate(prompts)]
        for i, task in enumerate(tasks):
            task.add_done_callback(lambda _, i=i: completed.append(i))
        return await asyncio.gather(*tasks), completed

    outputs, completed = asyncio.run(submit())
    direct = sample_batch(server.model, prompts, Sampling(temperature=1.0, max_tokens=12, logprobs=True),
                          [request_seed(6, 1, f"p{i}", "s0") for i in range(len(prompts))], server.eos_ids)
    assert [out.token_ids for out in outputs] == [tokens for tokens, *_ in direct]
    by_length = [len(outputs[i].token_ids) + (outputs[i].stop_reason == "length") for i in completed]
    assert by_length == sorted(by_length) and completed != sorted(completed)

def test_a_submission_that_never_fills_fails_its_requests(server, monkeypatch):
    import stapo.verl_plugin.cpu.rollout as rollout

    monkeypatch.setattr(rollout, "GROUP_WAIT_S", 0.2)

    async def short():
        await server.expect_batch(3)
        return await asyncio.gather(_generate(server, [3, 4], 1), _generate(server, [3, 5], 2))

    with pytest.raises(RuntimeError, match="2 of the 3 requests the trainer announced arrived"):
        asyncio.run(short())
    assert not server._batches
    with pytest.raises(ValueError, match="a submission of 0 rows"):
        asyncio.run(server.expect_batch(0))


def test_server_refuses_inconsistent_groups(server, monkeypatch):
    import stapo.verl_plugin.cpu.rollout as rollout

    async def bad_index():
        return await _group_request(server, [3, 4], "g1", 2, 5)

    with pytest.raises(ValueError, match=r"sample index 5 is outside \[0, 2\)"):
        asyncio.run(bad_index())

    async def other_prompt():
        first, second = _group_request(server, [3, 4], "g2", 2, 0), _group_request(server, [3, 5], "g2", 2, 1)
        return await asyncio.gather(first, second)

    with pytest.raises(ValueError, match="differ in prompt"):
        asyncio.run(other_prompt())
    monkeypatch.setattr(rollout, "GROUP_WAIT_S", 0.2)
    server._groups.clear()

    async def missing_sibling():
        return await _group_request(server, [3, 4], "g3", 3, 0)

    with pytest.raises(RuntimeError, match="1 of 3 requests arrived"):
        asyncio.run(missing_sibling())
    assert not server._groups


def test_group_size_from_sampling_parameters():
    from omegaconf import OmegaConf

    from stapo.verl_plugin.reproducible.seeded_agent_loop import group_size

    rollout = OmegaConf.create(
        {"n": 8, "temperature": 0.7, "top_p": 1.0, "top_k": -1, "val_kwargs": {"n": 1, "temperature": 0, "top_p": 1.0,
                                                                                "top_k": -1}}
    )
    train = {"temperature": 0.7, "top_p": 1.0, "top_k": -1, "logprobs": True}
    assert group_size(rollout, train) == 8
    assert group_size(rollout, dict(train, temperature=0)) is None  # greedy (validation's settings): never grouped
    rollout.val_kwargs.temperature, rollout.val_kwargs.n = 1.0, 4  # sampled validation, 4 per prompt
    assert group_size(rollout, dict(train, temperature=1.0)) == 4
    rollout.val_kwargs.temperature = 0
    assert group_size(rollout, dict(train, temperature=0.5)) is None  # neither: no group
    rollout.val_kwargs.temperature = 0.7  # validation samples like training, 4 vs 8 a prompt: cannot tell, no group
    assert group_size(rollout, train) is None
    rollout.val_kwargs.n = 8  # ... and as many a prompt: either way a group of 8 (the testbed preset)
    assert group_size(rollout, train) == 8
