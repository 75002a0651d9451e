"""A verl platform for CPU-only machines: device ``cpu``, collectives over gloo.

Ray still schedules workers on "GPU" slots (``ray_init.num_gpus=N`` fake slots), because verl's
resource pools count that resource; nothing ever touches a CUDA device.
"""

from __future__ import annotations

import contextlib
import types
from typing import Any, Optional

import torch
from verl.plugin.platform import PlatformBase, PlatformRegistry

PLATFORM_NAME = "stapo_cpu"


def _noop(*args, **kwargs):
    return None


class _CPUDeviceModule(types.SimpleNamespace):
    """What verl calls on ``get_torch_device()``: memory and cache calls become no-ops."""

    def __init__(self):
        super().__init__(
            empty_cache=_noop,
            synchronize=_noop,
            set_device=_noop,
            reset_peak_memory_stats=_noop,
            ipc_collect=_noop,
            memory_allocated=lambda *a, **k: 0,
            memory_reserved=lambda *a, **k: 0,
            max_memory_allocated=lambda *a, **k: 0,
            max_memory_reserved=lambda *a, **k: 0,
            mem_get_info=lambda *a, **k: (0, 0),
            current_device=lambda: "cpu",
            get_device_name=lambda *a, **k: "CPU",
            device_count=lambda: 1,
            is_available=lambda: True,
            manual_seed=torch.manual_seed,
            manual_seed_all=torch.manual_seed,
            get_rng_state=torch.get_rng_state,
            set_rng_state=torch.set_rng_state,
            Stream=contextlib.nullcontext,
            stream=lambda *a, **k: contextlib.nullcontext(),
            current_stream=lambda *a, **k: None,
            Event=None,
        )

    def __getattr__(self, name):  # anything else verl may probe: a harmless no-op
        if name.startswith("__"):  # keep Python's protocols (abc, pickle, copy) honest
            raise AttributeError(name)
        return _noop


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

    def synchronize(self, device_index: Optional[int] = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[Optional[int], Optional[int]]:
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
