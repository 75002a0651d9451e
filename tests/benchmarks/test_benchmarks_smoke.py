"""The benchmarks at tiny sizes, so they keep running: structure only (rows, finite ratios), never timings."""

from __future__ import annotations

import math

import pytest
import torch

from benchmarks import dp_quantile, e2e_step, entropy, loss_path, mask_build, old_pass, run
from benchmarks.common import TensorMemory


def finite(x) -> bool:
    return isinstance(x, float) and math.isfinite(x)


def test_loss_path_covers_every_variant_and_pattern():
    rows = loss_path.run(rows=2, tokens=64, prompt_len=8, repeats=1)
    assert len(rows) == len(loss_path.PATTERNS) * len(loss_path.VARIANTS)
    assert {(r["pattern"], r["variant"]) for r in rows} == {
        (p, v) for p in loss_path.PATTERNS for v in loss_path.VARIANTS
    }
    for r in rows:
        assert finite(r["ratio_vs_vanilla"]) and r["median_ms"] > 0
        assert r["peak_tensor_bytes"] > 0
        # the loss sees per-token tensors only: nothing larger than the micro-batch's token count
        assert r["largest_numel"] <= 2 * (64 + 8)
    current = [r for r in rows if r["variant"] == "stapo/current"]
    assert all(finite(r["ratio_vs_vanilla_H"]) for r in current)
    # the folded mask of source=old silences tokens only where there are positive low-probability ones
    masked = {r["pattern"]: r["masked"] for r in rows}
    assert masked["all_zero"] == 0 and masked["many_low_prob"] > 0
    table = loss_path.render(rows)
    assert table.count("\n| ") == len(rows) and "ratio of medians" in table


@pytest.mark.slow  # starts processes: out of make test-fast
def test_mask_build_and_old_pass_estimate():
    rows = mask_build.run(responses=8, max_len=256, repeats=1)
    assert [r["distribution"] for r in rows] == ["realistic", "all_max"]
    for r in rows:
        assert 0 < r["tokens"] <= 8 * 256 and finite(r["total_s"]) and r["peak_tensor_bytes"] > 0
    cost = old_pass.measure(
        tokens=8, repeats=1, cfg={**old_pass.MEASURED, "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128,
                                  "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32},
    )
    est = old_pass.batch_estimate(cost, rows[0]["lengths"], mask_build.PROMPT_LEN)
    assert est["measured_model_s"] > 0 and est["qwen3_1p7b_s"] > 0
    assert finite(est["qwen3_1p7b_s"])
    measured = mask_build.measure("cpu", **mask_build.SIZES["quick"])
    assert measured[0]["bench"] == "old_pass" and len(measured) == 3 and "lengths" not in measured[1]
    text = mask_build.render(measured)
    assert text.startswith("Yardstick") and "| realistic |" in text and "| all_max |" in text


@pytest.mark.slow  # starts processes: out of make test-fast
def test_dp_quantile_two_ranks():
    (row,) = dp_quantile.run(worlds=(2,), per_rank=200, micro_tokens=256, repeats=2)
    assert row["world"] == 2 and finite(row["q_ratio"]) and finite(row["detect_ratio"])
    assert "| 2 | 200 |" in dp_quantile.render([row])


def test_entropy_variants():
    rows = entropy.run(tokens=4, vocab=1024, chunk=2, repeats=1)
    assert [r["variant"] for r in rows] == list(entropy.VARIANTS)
    assert all(finite(r["ratio_vs_logp"]) for r in rows)
    by = {r["variant"]: r for r in rows}
    # keeping the entropy graph costs at least one more (tokens, vocab) tensor than log-probs alone
    assert by["logp+H"]["peak_tensor_bytes"] >= by["logp"]["peak_tensor_bytes"] + 4 * 1024 * 4
    assert all(f"| {variant} |" in entropy.render(rows) for variant in entropy.VARIANTS)


def test_tensor_memory_counts_live_bytes():
    x = torch.ones(1000, requires_grad=True)
    with TensorMemory() as mode:
        y = (x * 2).exp().sum()
        y.backward()
    assert mode.largest_numel == 1000
    assert 4000 <= mode.peak <= 4 * 4000 + 64


def test_every_registered_benchmark_measures_and_renders_its_own_section():
    for name in run.NAMES:
        bench = run.benchmark(name)
        assert bench.TITLE and set(bench.SIZES) == {"quick", "full"}
        assert callable(bench.measure) and callable(bench.render)


def test_cli_writes_only_its_sections_and_keeps_the_hand_written_text(tmp_path):
    doc = tmp_path / "BENCHMARKS.md"
    doc.write_text(f"# Benchmarks\n\nHow to read them.\n\n{run.NOTES_MARK}\n\nNotes by hand.\n")
    run.update_doc({"loss": run.section("loss", "Loss", "figures A", "header")}, doc)
    run.update_doc({"mask": run.section("mask", "Mask", "figures B", "header")}, doc)
    run.update_doc({"loss": run.section("loss", "Loss", "figures C", "header")}, doc)
    text = doc.read_text()
    assert "figures A" not in text and text.index("figures C") < text.index("figures B") < text.index(run.NOTES_MARK)
    assert text.startswith("# Benchmarks\n\nHow to read them.") and text.endswith("Notes by hand.\n")
    with pytest.raises(SystemExit):
        run.main(["--only", "nonsense"])


def test_e2e_reports_a_missing_trainer_without_figures():
    body = e2e_step.render([{"bench": "e2e", "error": "algo=stapo run failed\nlog line"}])
    assert body.startswith("Not measured") and "log line" in body


def test_validation_bootstrap_bench_runs_verls_metrics_both_ways_and_finds_the_same_values():
    from benchmarks import val_bootstrap

    rows = val_bootstrap.measure(torch.device("cpu"), shapes=((3, 4), (2, 1)), repeats=1)
    assert [(r["prompts"], r["samples"]) for r in rows] == [(3, 4), (2, 1)]
    assert all(r["same_values"] and finite(r["ratio"]) for r in rows)
    from verl.trainer.ppo import metric_utils

    assert not getattr(metric_utils.bootstrap_metric, "_stapo_vectorised", False)  # left as it found it
    assert "| 3 x 4 |" in val_bootstrap.render(rows)


def test_the_draw_bench_times_both_draws_and_finds_the_same_tokens():
    from benchmarks import sampler_draw

    rows = sampler_draw.measure(torch.device("cpu"), shapes=((5, 27, 1.0, 1.0), (3, 40, 0.7, 0.9)), repeats=2)
    assert [(r["rows"], r["vocab"]) for r in rows] == [(5, 27), (3, 40)]
    assert all(r["same_tokens"] and finite(r["ratio"]) for r in rows)
    assert "| 3 x 40 | 0.7 / 0.9 |" in sampler_draw.render(rows)
