"""The machine kind a sweep record keeps (stapo/runs/machine.py), the kind a model build records (its marker) and
the run folder's ``machine.json``, and the sweep's warning when the compared runs were made on, or their models
built on, several kinds; this machine's own /proc/cpuinfo read as well as written texts."""

from __future__ import annotations

import json

from stapo.models.cache import model_built_on
from stapo.rundir import read_machine, write_machine
from stapo.runs.machine import machine_kind, mixed_machines, model_from_another_kind, run_machine

AMD = ("processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse2 avx avx2 fma\n\n"
       "processor\t: 1\nmodel name\t: AMD EPYC\n")
XEON = "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Processor\nflags\t\t: avx2 avx512f avx512bw amx_tile amx_bf16\n"


def test_the_kind_names_the_model_and_the_widest_vector_extension():
    assert machine_kind(AMD) == "AMD EPYC (AVX2)"
    assert machine_kind(XEON) == "Intel(R) Xeon(R) Processor (AMX)"
    assert machine_kind(XEON.replace(" amx_tile amx_bf16", "")) == "Intel(R) Xeon(R) Processor (AVX-512)"
    assert machine_kind("model name\t: Old\nflags\t: sse2 avx\n") == "Old (no AVX2)"
    assert machine_kind("model name\t: No flags line\n") == "No flags line"
    here = machine_kind()
    assert here and here == machine_kind()  # this machine's, read from /proc/cpuinfo, the same each time


def test_the_sweep_warns_only_when_the_records_name_several_kinds():
    amd, xeon = {"machine": machine_kind(AMD)}, {"machine": machine_kind(XEON)}
    assert mixed_machines([amd, dict(amd), {}]) is None  # one kind; a record from before the field counts for none
    assert mixed_machines([]) is None
    warning = mixed_machines([amd, xeon, {"cell": "algo=grpo"}])
    assert warning.startswith("the compared runs were made on 2 kinds of machine (AMD EPYC (AVX2); Intel(R) Xeon(R)")
    assert "not paired bit for bit" in warning


def test_a_model_folder_names_the_kind_its_build_recorded_and_nothing_else_does(tmp_path):
    assert model_built_on(tmp_path / "absent") is None and model_built_on("Qwen/Qwen3-1.7B") is None
    assert model_built_on(tmp_path) is None  # a folder without a marker
    (tmp_path / "stapo_testbed.json").write_text(json.dumps({"recipe": {}}))  # a build from before the field
    assert model_built_on(tmp_path) is None
    (tmp_path / "stapo_broken.json").write_text("{not json")  # unreadable markers are passed over
    (tmp_path / "stapo_tailbed.json").write_text(json.dumps({"built_on": "AMD EPYC (AVX2)"}))
    assert model_built_on(tmp_path) == "AMD EPYC (AVX2)"
    assert run_machine(str(tmp_path)) == {"machine": machine_kind(), "model_built_on": "AMD EPYC (AVX2)"}
    assert run_machine("Qwen/Qwen3-1.7B") == {"machine": machine_kind(), "model_built_on": None}


def test_a_model_built_on_another_kind_is_noted_and_one_built_here_is_not():
    note = model_from_another_kind({"machine": "X (AVX2)", "model_built_on": "Y (AMX)"}, "/cache/testbed")
    assert note.startswith("/cache/testbed was built on another kind of machine (Y (AMX); this one: X (AVX2))")
    assert model_from_another_kind({"machine": "X (AVX2)", "model_built_on": "X (AVX2)"}, "/m") is None
    assert model_from_another_kind({"machine": "X (AVX2)", "model_built_on": None}, "/m") is None


def test_the_run_folder_keeps_the_machine_and_reads_nothing_from_a_missing_or_torn_file(tmp_path):
    assert read_machine(tmp_path) == {}
    machine = {"machine": "X (AVX2)", "model_built_on": None}
    write_machine(machine, tmp_path)
    assert read_machine(tmp_path) == machine
    (tmp_path / "machine.json").write_text('{"machine": "X')
    assert read_machine(tmp_path) == {}
    (tmp_path / "machine.json").write_text('["X"]')
    assert read_machine(tmp_path) == {}


def test_the_sweep_warns_when_the_models_were_built_on_several_kinds():
    amd, xeon = "AMD EPYC (AVX2)", "Intel(R) Xeon(R) Processor (AMX)"
    same_machine = [{"machine": amd, "model_built_on": amd}, {"machine": amd, "model_built_on": xeon}]
    warning = mixed_machines(same_machine)
    assert warning.startswith(f"the compared runs' models were built on 2 kinds of machine ({amd}; {xeon}): ")
    assert mixed_machines([{"machine": amd, "model_built_on": amd}, {"machine": amd}]) is None
    both = mixed_machines([{"machine": amd, "model_built_on": amd}, {"machine": xeon, "model_built_on": xeon}])
    assert both.startswith(f"the compared runs were made on 2 kinds of machine ({amd}; {xeon}) and the compared "
                           f"runs' models were built on 2 kinds of machine ({amd}; {xeon}): runs of one seed")
