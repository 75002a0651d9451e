"""A recorder for a trainer run: how verl's FSDP engine split each pass into micro-batches, and with what settings.

Loaded in every process of the run by verl's own hook for outside modules (``VERL_USE_EXTERNAL_MODULES`` in the
workers' environment, read by ``import verl``), it wraps verl's ``FSDPEngine.forward_backward_batch`` and the
``prepare_micro_batches`` it calls: both return exactly what verl's return, and one JSON line a pass goes to
the file named by ``RECORD_ENV`` (rank, update or log-prob pass, rows and tokens of each micro-batch, and the
engine's autocast dtype, compiled entropy, gradient checkpointing and padding-free flag). Without that variable
nothing is wrapped. Used by tests/e2e/test_gpu_preset_parity.py.
"""

from __future__ import annotations

import contextvars
import json
import os

RECORD_ENV = "STAPO_TEST_MICRO_BATCH_RECORD"
MODULE = "tests.e2e.micro_batch_record"
_pass: contextvars.ContextVar[dict | None] = contextvars.ContextVar("micro_batch_pass", default=None)


def _tokens(micro_batch) -> int:
    ids = micro_batch["input_ids"]
    if getattr(ids, "is_nested", False):
        return int(ids.offsets().diff().sum())
    return int(micro_batch["attention_mask"].sum())


def _wrap(transformer_impl) -> None:
    import torch
    from verl.utils import tensordict_utils as tu

    if getattr(transformer_impl, "_stapo_test_recorded", False):
        return
    transformer_impl._stapo_test_recorded = True
    split = transformer_impl.prepare_micro_batches
    engine_cls = transformer_impl.FSDPEngine
    forward_backward = engine_cls.forward_backward_batch

    def prepare_micro_batches(data, *args, **kwargs):
        micro_batches, indices = split(data, *args, **kwargs)
        record = _pass.get()
        if record is not None:
            record["rows"] = [len(mb) for mb in micro_batches]
            record["tokens"] = [_tokens(mb) for mb in micro_batches]
            record["use_dynamic_bsz"] = bool(tu.get_non_tensor_data(data, "use_dynamic_bsz", False))
            record["use_remove_padding"] = bool(tu.get_non_tensor_data(data, "use_remove_padding", False))
            budget = tu.get_non_tensor_data(data, "max_token_len_per_gpu", None)
            record["max_token_len_per_gpu"] = None if budget is None else int(budget)
        return micro_batches, indices

    def recorded_forward_backward(self, data, loss_function, forward_only=False):
        module = self.module
        inner = getattr(module, "_fsdp_wrapped_module", module)
        record = {
            "pid": os.getpid(),
            "rank": torch.distributed.get_rank() if torch.distributed.is_initialized() else 0,
            "forward_only": bool(forward_only),
            "autocast_dtype": str(getattr(self, "_autocast_dtype", None)),
            "param_dtype": str(next(module.parameters()).dtype),
            # torch.compile's wrapper keeps the function it compiled
            "entropy_compiled": hasattr(self.compute_entropy_from_logits, "_torchdynamo_orig_callable"),
            "gradient_checkpointing": bool(getattr(inner, "is_gradient_checkpointing", False)),
        }
        token = _pass.set(record)
        try:
            return forward_backward(self, data, loss_function, forward_only=forward_only)
        finally:
            _pass.reset(token)
            with open(os.environ[RECORD_ENV], "a", encoding="utf-8") as out:
                out.write(json.dumps(record) + "\n")

    transformer_impl.prepare_micro_batches = prepare_micro_batches
    engine_cls.forward_backward_batch = recorded_forward_backward


def read_records(path) -> list[dict]:
    with open(path, encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]


if os.environ.get(RECORD_ENV):
    from stapo.verl_plugin.import_hooks import after_import

    after_import("verl.workers.engine.fsdp.transformer_impl", _wrap)
