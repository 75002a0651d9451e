"""An FSDP actor checkpoint as a Hugging Face folder, through verl's own model merger.

verl's ``FSDPModelMerger`` reads ``fsdp_config.json``, joins the ranks' DTensor shards by their
placements and saves the model with the tokenizer, processor and generation config of the
checkpoint's ``huggingface/`` folder. It always casts the weights to bfloat16, though, and a model
whose log-probs must equal the actor's (the tiny CPU model trains in float32) needs its own dtype:
this subclass changes only the dtype of the joined tensors and of the saved ``config.json``.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from verl.model_merger.base_model_merger import ModelMergerConfig
from verl.model_merger.fsdp_model_merger import FSDPModelMerger, merge_non_dtensor_shards

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


class _DtypeMerger(FSDPModelMerger):
    def __init__(self, config: ModelMergerConfig, dtype: torch.dtype):
        super().__init__(config)
        self.dtype = dtype

    def _load_and_merge_state_dicts(self, world_size, total_shards, mesh_shape, mesh_dim_names):
        """verl's join (placements from the DTensors, replicated entries checked equal), in ``self.dtype``."""
        from torch.distributed.tensor import DTensor

        if len(mesh_shape) != 1:
            raise NotImplementedError(f"FSDP with tensor parallelism (mesh {mesh_dim_names}) is not supported")
        local_dir = Path(self.config.local_dir)
        shards = [
            torch.load(
                local_dir / f"model_world_size_{world_size}_rank_{rank}.pt", map_location="cpu", weights_only=False
            )
            for rank in range(total_shards)
        ]
        merged = {}
        for key in list(shards[0]):
            parts = [shard.pop(key) for shard in shards]
            if isinstance(parts[0], DTensor):
                placements = tuple(parts[0].placements)
                if mesh_dim_names[0] in ("dp", "ddp"):
                    placements = placements[1:]  # replicated over data-parallel groups
                local = [part._local_tensor.to(self.dtype) for part in parts]
                merged[key] = self._merge_by_placement(local, placements[0])
            else:
                merged[key] = merge_non_dtensor_shards(key, [part.to(self.dtype) for part in parts])
        return merged


def checkpoint_dtype(actor_dir: str | Path) -> str:
    """The dtype the model's own config names (``huggingface/config.json``), float32 when it names none."""
    config = json.loads((Path(actor_dir) / "huggingface" / "config.json").read_text())
    name = str(config.get("dtype") or config.get("torch_dtype") or "float32").removeprefix("torch.")
    return name if name in DTYPES else "float32"


def merge_fsdp_checkpoint(actor_dir: str | Path, target_dir: str | Path, dtype: str) -> None:
    """``actor_dir`` (``global_step_N/actor``) -> ``target_dir`` (model, tokenizer, generation config)."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    config = ModelMergerConfig(
        operation="merge",
        backend="fsdp",
        local_dir=str(actor_dir),
        target_dir=str(target_dir),
        hf_model_config_path=str(Path(actor_dir) / "huggingface"),
    )
    Path(target_dir).mkdir(parents=True, exist_ok=True)
    # bfloat16 is verl's own path unchanged
    merger = FSDPModelMerger(config) if dtype == "bfloat16" else _DtypeMerger(config, DTYPES[dtype])
    merger.merge_and_save()
    merger.cleanup()
    # verl builds the empty model in bfloat16 before saving: the config must name the weights' dtype
    config_path = Path(target_dir) / "config.json"
    saved = json.loads(config_path.read_text())
    saved["dtype"] = dtype
    saved.pop("torch_dtype", None)
    config_path.write_text(json.dumps(saved, indent=2, sort_keys=True) + "\n")
