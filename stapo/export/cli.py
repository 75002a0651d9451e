"""`stapo export RUN_DIR|CKPT_DIR [--step N] OUT`: a saved step as a Hugging Face model folder.

verl's FSDP model merger does the weights (``stapo.verl_plugin.export.merger``); this command picks the
step (the latest by default), copies the tokenizer and generation config the trainer used
byte for byte, and writes a model card with the run's config, algorithm and the step's metrics.
The folder is assembled beside OUT and renamed into place, so OUT is never half written.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import yaml

from stapo.export.card import algorithm, model_card
from stapo.export.locate import RUN_CONFIG, ExportError, Source, locate

# files of the checkpoint's huggingface/ folder that are not copied verbatim (the merger writes them)
_NOT_COPIED = {"config.json"}
DTYPE_CHOICES = ("auto", "bfloat16", "float16", "float32")
INFO_NAME = "stapo_export.json"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="stapo export", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "source",
        help="run folder (stapo.run_dir), checkpoint folder (trainer.default_local_dir), or one global_step_N folder",
    )
    parser.add_argument("out", type=Path, help="the Hugging Face model folder to write")
    parser.add_argument("--step", type=int, help="global step to export (default: the latest saved)")
    parser.add_argument(
        "--run-dir",
        help="the run folder whose config and metrics go into the model card, when SOURCE is a checkpoint folder",
    )
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=DTYPE_CHOICES,
        help="weights' dtype (default auto: the model config's own, e.g. bfloat16 for Qwen3)",
    )
    parser.add_argument("--force", action="store_true", help="replace OUT when it exists")
    return parser


def _read_run(source: Source) -> tuple[dict | None, dict[str, float] | None]:
    """The run's resolved config and the metrics of the exported step (None where there is no run folder)."""
    if source.run_dir is None:
        return None, None
    from stapo.rundir import read_metrics

    config = yaml.safe_load((source.run_dir / RUN_CONFIG).read_text())
    try:
        metrics = read_metrics(source.run_dir).get(source.step)
    except FileNotFoundError:
        metrics = None
    return config, metrics


def export(source: Source, out: Path, dtype: str = "auto", force: bool = False) -> Path:
    """Write the export of ``source`` to ``out``; returns ``out``."""
    from stapo.verl_plugin.export.merger import checkpoint_dtype, merge_fsdp_checkpoint

    out = out.expanduser().resolve()
    if out.exists() and any(out.iterdir()) and not force:
        raise ExportError(f"{out} exists and is not empty: choose another folder or pass --force")
    dtype = checkpoint_dtype(source.actor_dir) if dtype == "auto" else dtype
    config, metrics = _read_run(source)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        merge_fsdp_checkpoint(source.actor_dir, staging, dtype)
        hf_dir = source.actor_dir / "huggingface"
        for item in sorted(hf_dir.iterdir()):  # tokenizer, chat template, generation config: as trained
            if item.is_file() and item.name not in _NOT_COPIED:
                shutil.copy2(item, staging / item.name)
        model_config = json.loads((staging / "config.json").read_text())
        card = model_card(
            step=source.step,
            steps=source.steps,
            source=str(source.actor_dir),
            dtype=dtype,
            config=config,
            model_config=model_config,
            metrics=metrics,
            run_dir=str(source.run_dir) if source.run_dir else None,
        )
        (staging / "README.md").write_text(card, encoding="utf-8")
        info = {
            "step": source.step,
            "checkpoint": str(source.actor_dir),
            "run_dir": str(source.run_dir or ""),
            "dtype": dtype,
            "algorithm": algorithm(config) if config else None,
            "metrics": metrics or {},
        }
        (staging / INFO_NAME).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
        for item in staging.iterdir():
            item.chmod(0o644)  # safetensors and mkdtemp make private files; a model folder is for sharing
        staging.chmod(0o755)
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    try:
        source = locate(args.source, args.step, args.run_dir)
        for note in source.notes:
            print(f"stapo export: note: {note}", file=sys.stderr)
        out = export(source, args.out, args.dtype, args.force)
    except ExportError as error:
        print(f"stapo export: error: {error}", file=sys.stderr)
        return 2
    print(f"exported step {source.step} of {source.ckpt_root} to {out}")
    return 0
