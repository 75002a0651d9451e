"""The machine kind a sweep record keeps (stapo/runs/machine.py) and the sweep's warning when the compared runs were
made on several kinds; this machine's own /proc/cpuinfo read as well as written texts."""

from __future__ import annotations

from stapo.runs.machine import machine_kind, mixed_machines

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
