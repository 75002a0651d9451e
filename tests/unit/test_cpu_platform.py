"""The CPU back-end's device module answers exactly the calls it lists, and refuses the rest by name."""

from __future__ import annotations

import copy
import pickle

import pytest

from stapo.verl_plugin.cpu.platform import STUBS, PlatformStapoCPU


def test_listed_calls_answer_as_a_cpu():
    device = PlatformStapoCPU().device_module
    assert device.is_available() is True
    assert device.memory_allocated() == 0 and device.max_memory_reserved() == 0
    assert device.mem_get_info() == (0, 0)
    assert device.empty_cache() is None and device.synchronize() is None
    assert all(reason for _, reason in STUBS.values())  # every stub says why a CPU answer is right


@pytest.mark.parametrize("name", ["set_per_process_memory_fraction", "Stream", "manual_seed", "get_rng_state"])
def test_an_unlisted_call_raises_naming_it(name):
    device = PlatformStapoCPU().device_module
    with pytest.raises(AttributeError, match=rf"get_torch_device\(\)\.{name}\b"):
        getattr(device, name)
    assert not hasattr(device, name)  # verl's hasattr probes see a missing attribute, not a no-op


def test_protocol_lookups_stay_honest():
    device = PlatformStapoCPU().device_module
    assert copy.deepcopy(device) is not None and pickle.loads(pickle.dumps(device)) is not None
