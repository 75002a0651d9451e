"""The e2e and tq sections render what their ``measure`` returns (formatting only, no trainer run)."""

from benchmarks import e2e_step, tq_roundtrip


def test_e2e_section_gives_stapo_against_each_baseline():
    algos = ["stapo", "grpo", "justrl"]
    phases = {p: {"stapo": 1.0, "grpo": 2.0, "justrl": 1.0} for p in e2e_step.PHASES}
    result = {
        "bench": "e2e",
        "algos": algos,
        "median_s": {"stapo": 3.0, "grpo": 3.3, "justrl": 3.0},
        "ratio": {"grpo": 3.0 / 3.3, "justrl": 1.0},
        "pair_ratio": {"grpo": 0.9, "justrl": 1.01},
        "samples": {a: [3.0, 3.1] for a in algos},
        "runs": 3,
        "steps": 6,
        "load": ["1.0 1.1 1.2"] * 3,
        "spread": {a: 0.1 for a in algos},
        "phases": phases,
    }
    body = e2e_step.render([result])
    assert "Ratio stapo / grpo (medians): **0.909**" in body and "Ratio stapo / justrl (medians): **1.000**" in body
    assert "| `timing_s/ref` | 1.000 | 2.000 | 1.000 | 0.500 | 1.000 |" in body
    assert "1.0 1.1 1.2" in body


def test_tq_section_has_a_column_per_phase():
    row = {
        "distribution": "realistic",
        "responses": 4,
        "max_len": 8,
        "tokens": 20,
        "mean_len": 5.0,
        "masked": 1,
        "quiet_s": 0.25,
        "total_s": 1.5,
        "total_spread": 0.1,
        "rss_peak_delta_bytes": 2**20,
        "store_s": 0.2,
        **{f"{p}_s": 0.1 for p in tq_roundtrip.PHASES},
        **{f"fold_dp{dp}_s": 0.5 / dp for dp in tq_roundtrip.DP_SIZES},
    }
    body = tq_roundtrip.render([row])
    header, _, line = body.splitlines()[-3:]
    assert header.count("|") == line.count("|")
    assert "**0.25**" in line and "1.50 (0.10)" in line and "1.00 MiB" in line
    assert "| 0.50 | 0.06 | 0.01 |" in line
