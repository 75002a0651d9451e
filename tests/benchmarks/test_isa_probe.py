"""benchmarks/isa_probe.py: the fingerprint that tells whether a pinned setting makes the CPU's kind not matter.

Real parts: the testbed's model shape trained with torch on this CPU, each setting in a fresh process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import isa_probe

REPO = Path(__file__).resolve().parents[2]


def test_the_fingerprint_is_a_function_of_the_training_and_sees_one_step_more():
    first, again, longer = isa_probe.fingerprint(2), isa_probe.fingerprint(2), isa_probe.fingerprint(3)
    assert first["sha256"] == again["sha256"] and first["last_loss"] == again["last_loss"]
    assert longer["sha256"] != first["sha256"]


@pytest.mark.slow  # starts processes: out of make test-fast
def test_each_setting_runs_in_its_own_process_with_its_capability(tmp_path):
    out = tmp_path / "probe.json"
    isa_probe.main(["--steps", "1", "--only", "aten-avx2,portable", "--json", str(out)])
    found = json.loads(out.read_text())
    assert found["machine"] and found["steps"] == 1 and list(found["settings"]) == ["aten-avx2", "portable"]
    assert found["settings"]["aten-avx2"]["capability"] == "AVX2"  # every machine of the project has AVX2
    assert found["settings"]["portable"]["capability"] == "DEFAULT"
    assert found["settings"]["portable"]["env"] == {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE"}


def test_an_unknown_setting_is_refused_naming_the_allowed_ones(capsys):
    with pytest.raises(SystemExit):
        isa_probe.main(["--only", "avx9"])
    error = capsys.readouterr().err
    assert "--only: unknown setting(s) avx9; allowed: native, aten-avx2, avx2-capped, portable" in error


def test_the_recorded_xeon_fingerprints_are_what_the_reproducibility_doc_says():
    recorded = json.loads((REPO / "benchmarks" / "machine_kinds" / "2026-11-28-xeon-avx512.json").read_text())
    settings = recorded["settings"]
    assert list(settings) == list(isa_probe.SETTINGS) and recorded["machine"] == "Intel(R) Xeon(R) Processor (AMX)"
    assert all(settings[name]["env"] == env for name, env in isa_probe.SETTINGS.items())
    assert len({value["sha256"] for value in settings.values()}) == 4  # "the four fingerprints all differ"
    ratio = settings["portable"]["seconds"] / settings["native"]["seconds"]
    doc = " ".join((REPO / "docs" / "reproducibility.md").read_text().split())
    assert f"the last setting took {ratio:.1f}x the first's time" in doc
