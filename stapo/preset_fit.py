"""A CPU preset run with a model, data or device it was not made for: refused in one line before Ray.

Leaving out ``model_preset=`` composes the CPU test preset ``tiny`` (``conf/stapo_trainer.yaml``'s
defaults): ``actor_rollout_ref.model.path=Qwen/Qwen2.5-7B`` and a cluster's data on top of it would
compose into a run with 16-token responses, 3 steps, the HF rollout on the CPU and a synthetic reward,
which every other check accepts. Each CPU preset records what it was made for under ``stapo.cpu_preset``
(its model, its device; its data are the files it generates under ``stapo.synthetic_data_dir``), and a
run that changes one of them is refused here, naming the preset, the setting and a GPU preset to use
instead, unless it says ``stapo.cpu_preset.allow_other_inputs=true`` (a CPU trial of another small
model or data at the preset's sizes, on purpose: ``stapo demo --model FOLDER``).
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from stapo.algorithm.validation import STAPOConfigError

MODEL_KEY = "actor_rollout_ref.model.path"
ALLOW_KEY = "stapo.cpu_preset.allow_other_inputs"
DATA_KEYS = ("data.train_files", "data.val_files")
# the GPU preset the refusal names first: the paper's 8B recipe
FIRST_GPU_PRESET = "qwen3_8b"


def gpu_presets() -> list[str]:
    """The model presets without a ``cpu_preset:`` record, the first one to name first (read from the files:
    a new GPU preset is named without a change here)."""
    from stapo.config_dir import config_dir

    folder = Path(config_dir()) / "model_preset"
    names = sorted(path.stem for path in folder.glob("*.yaml")
                   if not path.stem.startswith("_") and "cpu_preset:" not in path.read_text(encoding="utf-8"))
    return sorted(names, key=lambda name: name != FIRST_GPU_PRESET)


def _files(config, key: str) -> list[str]:
    files = OmegaConf.select(config, key, default=None)
    return [str(files)] if isinstance(files, str) else [str(path) for path in files or []]


def _is_generated(path: str, folder) -> bool:
    """``path`` lies in the preset's generated-data folder (what ``prepare()`` writes)."""
    if not folder or "://" in path:
        return False
    return Path(path).expanduser().resolve().is_relative_to(Path(str(folder)).expanduser().resolve())


def misfits(config) -> list[str]:
    """``key=value`` of each input the composed CPU preset was not made for; ``[]`` for a GPU preset, a run that
    allows other inputs, or a run of the preset's own."""
    made_for = OmegaConf.select(config, "stapo.cpu_preset", default=None)
    if made_for is None or OmegaConf.select(config, ALLOW_KEY, default=False) is True:
        return []
    found = []
    device = OmegaConf.select(config, "trainer.device", default=None)
    if device != made_for.device:
        found.append(f"trainer.device={device}")
    model = OmegaConf.select(config, MODEL_KEY, default=None)
    if model != made_for.model:
        found.append(f"{MODEL_KEY}={model}")
    folder = OmegaConf.select(config, "stapo.synthetic_data_dir", default=None)
    for key in DATA_KEYS:
        other = [path for path in _files(config, key) if not _is_generated(path, folder)]
        if other:
            found.append(f"{key}={other[0]}")
    return found


def check_preset_fit(config) -> None:
    """Refuse a CPU preset given another model, data or device, in one line that says what to do instead."""
    found = misfits(config)
    if not found:
        return
    made_for = OmegaConf.select(config, "stapo.cpu_preset")
    gpu = gpu_presets() or [FIRST_GPU_PRESET]
    others = f" (or {', '.join(gpu[1:])})" if len(gpu) > 1 else ""
    steps = OmegaConf.select(config, "trainer.total_training_steps", default=None)
    sizes = f"data.max_response_length={OmegaConf.select(config, 'data.max_response_length')}"
    sizes += f", trainer.total_training_steps={steps}" if steps is not None else ""
    raise STAPOConfigError(
        f"model_preset={made_for.name} ({made_for.about}; {sizes}) is a CPU preset made for {MODEL_KEY}="
        f"{made_for.model}, the data it generates and trainer.device={made_for.device}, not for "
        f"{' and '.join(found)}: for your own model and data name a GPU preset, model_preset={gpu[0]}{others}, with "
        f"{MODEL_KEY}=... and data.train_files=... data.val_files=...; {ALLOW_KEY}=true keeps this CPU preset on "
        "purpose"
    )
