"""A verl platform for CPU-only machines: device ``cpu``, collectives over gloo.

Ray still schedules workers on "GPU" slots (``ray_init.num_gpus=N`` fake slots), because verl's
resource pools count that resource; nothing ever touches a CUDA device.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from verl.plugin.platform import PlatformBase, PlatformRegistry

PLATFORM_NAME = "stapo_cpu"


def _noop(*args, **kwargs):
    return None


def _zero(*args, **kwargs):
    return 0


# What verl 0.9.1 reads from ``get_torch_device()`` (its ``torch.cuda`` stand-in) on the CPU back-end,
# recorded from the tiny e2e runs (grpo/stapo, checkpoint and resume, 2 gloo ranks), and why each
# answer is right for a CPU. Anything else raises: a new verl call shows up instead of being skipped.
STUBS: dict[str, tuple[object, str]] = {
    "is_available": (lambda: True, "verl asks before memory logging; the platform is the device"),
    "empty_cache": (_noop, "no allocator cache to free on a CPU"),
    "synchronize": (_noop, "CPU ops are synchronous"),
    "get_device_name": (lambda *a, **k: "CPU", "log lines and flops tables"),
    "memory_allocated": (_zero, "device memory logs (log_gpu_memory_usage): a CPU has no device memory"),
    "memory_reserved": (_zero, "same; verl reports host memory as perf/cpu_memory_used_gb"),
    "max_memory_allocated": (_zero, "perf/max_memory_allocated_gb"),
    "max_memory_reserved": (_zero, "perf/max_memory_reserved_gb"),
    "mem_get_info": (lambda *a, **k: (0, 0), "free/total device memory in the same logs"),
    "set_rng_state": (
        lambda state, *a, **k: torch.set_rng_state(state),
        (
            "on resume verl's load_rng_state hands rng_state['cpu'] to the device module when the device is "
            "'cpu': the CPU generator's own state, restored a second time"
        ),
    ),
}


class _CPUDeviceModule:
    """The device module of the STAPO CPU platform: exactly the calls in ``STUBS``, nothing else."""

    def __getattr__(self, name):
        if name in STUBS:
            return STUBS[name][0]
        raise AttributeError(
            f"the STAPO CPU back-end's device module has no {name!r}: verl called get_torch_device().{name}, "
            f"which is not stubbed for the CPU (stubbed: {', '.join(sorted(STUBS))}); add it to "
            "stapo/verl_plugin/cpu/platform.py STUBS with the reason a CPU answer is right"
        )

    def __dir__(self):
        return sorted(STUBS)


@PlatformRegistry.register(platform=PLATFORM_NAME)
class PlatformStapoCPU(PlatformBase):
    """Selected with VERL_PLATFORM=stapo_cpu (set by the CPU back-end, never auto-detected)."""

    _device_module = _CPUDeviceModule()

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self):
        return self._device_module

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check=False) -> bool:
        return False  # only chosen explicitly, so a GPU machine never lands here by detection

    def current_device(self) -> str:
        # verl passes this to .to(device=...) and device_id=; an int would mean "accelerator 0"
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"

    @contextlib.contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]

    def is_ipc_supported(self) -> bool:
        return False

    def rollout_env_vars(self) -> dict[str, str]:
        return {}

    def get_collective_module(self) -> Any:
        return None

    def cudart(self) -> Any:
        return None
