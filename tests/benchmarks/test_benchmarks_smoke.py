"""The benchmarks run at tiny sizes (structure only: rows produced, ratios finite; never timings)."""

from __future__ import annotations

import math

from benchmarks import loss_path, mask_build


def test_loss_path_rows_cover_every_variant_and_pattern():
    rows = loss_path.run(rows=2, tokens=64, repeats=1)
    assert {r["variant"] for r in rows} == {"vanilla", "stapo/old", "stapo/current"}
    assert len(rows) == 3 * len(loss_path.PATTERNS)
    assert all(math.isfinite(r["ratio_vs_vanilla"]) and r["median_ms"] > 0 for r in rows)


def test_mask_build_and_dp_quantile_report_sizes():
    mask = mask_build.time_mask(8, 128, repeats=1)
    assert 0 < mask["tokens"] <= mask["padded"] == 8 * 128
    q = mask_build.time_dp_quantile(2, 100)
    assert q["world"] == 2 and q["global_seconds"] > 0
