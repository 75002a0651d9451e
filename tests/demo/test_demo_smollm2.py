"""`stapo demo` on the real SmolLM2-135M-Instruct weights (shipped by a package), at tiny sizes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(900)


def test_demo_analysis_runs_on_real_weights(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "stapo.cli", "demo", "--prompts", "2", "--group-size", "4",
         "--max-new-tokens", "12", "--out", str(out), "--tau-p", "0.05"],
        capture_output=True, text=True, timeout=800, env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin",
                                                          "HOME": str(__import__("pathlib").Path.home())},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "S2T analysis" in proc.stdout
    metrics = json.loads((out / "s2t_analysis.json").read_text())
    assert metrics["response_tokens"] > 0 and 0.0 <= metrics["mask_ratio"] <= 1.0
    assert 0.0 <= metrics["accuracy"] <= 1.0
    for line in (out / "spurious_tokens.jsonl").read_text().splitlines():
        record = json.loads(line)
        assert record["prob"] < 0.05 and set(record) >= {"token", "before", "after", "entropy"}


def test_demo_rejects_bad_settings_before_loading_anything():
    proc = subprocess.run(
        [sys.executable, "-m", "stapo.cli", "demo", "--tau-p", "2"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode != 0
    assert "stapo demo: error: --tau_p must be a probability in (0, 1)" in proc.stderr
    assert "Traceback" not in proc.stderr
