"""BENCHMARKS.md's image figures are the ones its record holds (benchmarks/image_build.py renders them)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from benchmarks.image_build import MARKERS, render

REPO = Path(__file__).resolve().parents[2]


def test_the_image_section_is_rendered_from_the_record_it_names():
    text = (REPO / "BENCHMARKS.md").read_text(encoding="utf-8")
    start, end = text.index(MARKERS[0]), text.index(MARKERS[1]) + len(MARKERS[1])
    section = text[start:end]
    source = re.search(r"From `(benchmarks/image_runs/[^`]+\.json)`", section).group(1)
    record = json.loads((REPO / source).read_text(encoding="utf-8"))
    assert section == render(record, source)


def test_the_render_names_every_step_and_both_sizes():
    step = {"command": "make image-base", "seconds": 61.0}
    layer = {"bytes": 2**30, "step": "RUN pip install"}
    record = {"machine": "CPU X (AVX2)", "cpus": 2, "load_before": 0.1, "load_after": 0.2, "from_nothing": True,
              "engine": "podman 4", "steps": [step], "sizes": {
                  "localhost/stapo-base:py311-torch2.11.0-vllm0.24.0": {"bytes": 10 * 2**30, "layers": [layer]},
                  "stapo:0.1.0-verl0.9.1-vllm024": {"bytes": 11 * 2**30, "layers": [layer, layer]}}}
    out = render(record, "benchmarks/image_runs/x.json")
    assert "| `make image-base` | 61 |" in out and "The image 11.0 GiB, the stand-in base 10.0 GiB" in out
    assert "from nothing" in out and out.startswith(MARKERS[0]) and out.endswith(MARKERS[1])
