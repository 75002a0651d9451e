"""Checks of what a run reads from disk (the model and the data files), on the driver before Ray starts.

verl opens these inside its TaskRunner and workers, after a cluster start-up: a missing file, a
truncated parquet or a wrong column fails minutes later inside Ray's errors. Here it costs the
parquet footer. Each check returns a note saying what the path was taken as (shown by
``stapo check``) or raises :class:`STAPOConfigError` naming the key.

``STAPO_SKIP_PATH_CHECKS=1`` skips them, for files that only the worker nodes can see.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from omegaconf import OmegaConf

from stapo.algorithm.validation import STAPOConfigError, did_you_mean

MODEL_KEY = "actor_rollout_ref.model.path"
SKIP_ENV = "STAPO_SKIP_PATH_CHECKS"
# the formats verl's RLHFDataset reads (verl/utils/dataset/rl_dataset.py, _read_files_and_tokenize)
DATA_SUFFIXES = (".parquet", ".json", ".jsonl")
# org/name, as the hub spells model ids; a single name ("gpt2") is a legacy hub id
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def check_inputs(config) -> list[str]:
    """The model path and the data files, one note each; ``[]`` when skipped by ``STAPO_SKIP_PATH_CHECKS=1``."""
    if os.environ.get(SKIP_ENV) == "1":
        return [f"model and data paths not checked ({SKIP_ENV}=1)"]
    notes = [check_model_path(OmegaConf.select(config, MODEL_KEY, default=None))]
    generated = _generated_files(config)
    columns = _required_columns(config)
    for key in ("data.train_files", "data.val_files"):
        files = OmegaConf.select(config, key, default=None)
        for path in [files] if isinstance(files, str) else list(files or []):
            notes.append(check_data_file(key, str(path), columns, generated))
    notes.append(check_steps_fit_the_epochs(config, generated))
    return notes


def train_rows(config, generated: set[Path]) -> int | None:
    """The rows of ``data.train_files`` before verl's length filter (capped by ``data.train_max_samples``):
    the recipe's count for generated files, the parquet footers otherwise; None when a file's count is
    not known here (remote, json)."""
    files = OmegaConf.select(config, "data.train_files", default=None)
    rows = 0
    for path in [files] if isinstance(files, str) else list(files or []):
        file = Path(str(path)).expanduser()
        if "://" not in str(path) and file.resolve() in generated:
            rows += int(OmegaConf.select(config, "stapo.synthetic_train_rows"))
        elif "://" not in str(path) and file.suffix == ".parquet" and file.is_file():
            import pyarrow.parquet as pq

            rows += pq.ParquetFile(file).metadata.num_rows
        else:
            return None
    cap = OmegaConf.select(config, "data.train_max_samples", default=-1)
    return min(rows, int(cap)) if cap is not None and int(cap) > 0 else rows


def check_steps_fit_the_epochs(config, generated: set[Path]) -> str:
    """verl trains ``trainer.total_training_steps`` but stops at the end of its last epoch
    (``trainer.total_epochs`` passes over ``rows // data.train_batch_size`` batches), with its progress bar
    and learning-rate schedule sized for the steps asked: a run asking more steps than the epochs hold
    ends early, as a success. Refused here, with the epochs that would hold them."""
    steps = OmegaConf.select(config, "trainer.total_training_steps", default=None)
    rows = train_rows(config, generated)
    if rows is None:
        return "steps: trainer.total_epochs decides" if steps is None else "steps: not checked against the data"
    batch = int(OmegaConf.select(config, "data.train_batch_size"))
    epochs = int(OmegaConf.select(config, "trainer.total_epochs", default=1))
    per_epoch = rows // batch
    if per_epoch == 0:  # with the steps unset too: verl sizes the run as epochs x 0 batches and trains none
        raise STAPOConfigError(
            f"data.train_files hold {rows} rows, fewer than one batch of data.train_batch_size={batch}: verl trains "
            "no step"
        )
    if steps is None:
        return (f"steps: {per_epoch * epochs}, trainer.total_epochs={epochs} of {per_epoch} ({rows} training rows)"
                + rows_left_out(config, rows, batch, per_epoch * epochs))
    if int(steps) > per_epoch * epochs:
        raise STAPOConfigError(
            f"trainer.total_training_steps={steps} is more than trainer.total_epochs={epochs} hold: {rows} training "
            f"rows make {per_epoch} steps of data.train_batch_size={batch} an epoch, and verl stops after the last "
            f"epoch; set trainer.total_epochs={-(-int(steps) // per_epoch)} or fewer steps"
        )
    return (f"steps: {steps}, {per_epoch} an epoch of {rows} training rows, at most {epochs} epoch(s)"
            + rows_left_out(config, rows, batch, int(steps)))


def rows_left_out(config, rows: int, batch: int, steps: int) -> str:
    """What the run never trains on, said: verl's training dataloader drops the last incomplete batch of each
    epoch (``drop_last=True``, verl/trainer/ppo/v1/trainer_base.py), and a run of fewer steps than one epoch
    reads only ``steps x batch`` rows. Counted before verl's prompt-length filter (``data.filter_overlong_prompts``)."""
    left = rows % batch
    shuffled = bool(OmegaConf.select(config, "data.shuffle", default=True))
    which = "other rows each epoch (data.shuffle=true)" if shuffled else "the same last rows each epoch"
    text = (f"; each epoch leaves out {left} of the {rows} rows ({which}: verl drops the last incomplete batch of "
            f"data.train_batch_size={batch})" if left else "")
    if steps * batch < rows - left:
        text += f"; the run's {steps} step(s) read {steps * batch} of the {rows} rows"
    return text


def planned_steps(config) -> int | None:
    """The steps the run will train: ``trainer.total_training_steps``, else ``trainer.total_epochs`` passes over
    the training rows (None when their count is not known here)."""
    steps = OmegaConf.select(config, "trainer.total_training_steps", default=None)
    if steps is not None:
        return int(steps)
    rows = train_rows(config, _generated_files(config))
    if rows is None:
        return None
    batch = int(OmegaConf.select(config, "data.train_batch_size"))
    return rows // batch * int(OmegaConf.select(config, "trainer.total_epochs", default=1))


def check_model_path(path, key: str = MODEL_KEY) -> str:
    """A ``stapo://`` name, a local folder with a ``config.json``, or a hub id: which one it is."""
    from stapo.models.local import LOCAL_MODELS, SCHEME

    if not isinstance(path, str) or not path:
        raise STAPOConfigError(f"{key} must be a model folder, a hub id or stapo://NAME, got {path!r}")
    if path.startswith(SCHEME):
        name = path[len(SCHEME):]
        known = [SCHEME + known for known in LOCAL_MODELS]
        if name not in LOCAL_MODELS:
            raise STAPOConfigError(
                f"{key}={path}: unknown local model, known: {known}{did_you_mean(path, known)}"
            )
        return f"model: {path}, built locally on first use and cached (stapo/models)"
    if "://" in path:
        return f"model: {path}, a remote path, not checked here (verl copies it to each node)"
    folder = Path(path).expanduser()
    if folder.is_dir():
        if not (folder / "config.json").is_file():
            saved = any(folder.glob("global_step_*")) or any(folder.glob("*/global_step_*")) or (
                folder / "fsdp_config.json").is_file()
            hint = " (a verl checkpoint: `stapo export` turns a saved step into one)" if saved else ""
            raise STAPOConfigError(f"{key}={path}: a model folder needs a config.json (Hugging Face layout){hint}")
        return f"model: {path}, a local folder"
    if folder.exists():
        raise STAPOConfigError(f"{key}={path}: is a file; give the model's folder (with config.json)")
    if path.startswith(("/", ".", "~")) or path.count("/") > 1 or not HUB_ID.match(path):
        raise STAPOConfigError(f"{key}={path}: no such folder (nor a hub id of the form org/name)")
    if os.environ.get("HF_HUB_OFFLINE") == "1" and not _in_hub_cache(path):
        raise STAPOConfigError(f"{key}={path}: HF_HUB_OFFLINE=1 but the hub id is not in the local cache")
    return f"model: {path}, a hub id (not checked here: each node downloads it, or reads its hub cache)"


def _in_hub_cache(repo_id: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)


def check_data_file(key: str, path: str, columns: dict[str, str], generated: set[Path]) -> str:
    """Exists, a format verl reads, a readable parquet with rows and the columns verl's loader and reward read."""
    if Path(path).expanduser().resolve() in generated:
        return f"{key}: {path}, generated by the recipe (stapo.synthetic_data_dir)"
    if "://" in path:
        return f"{key}: {path}, a remote path, not checked here"
    file = Path(path).expanduser()
    if not file.is_file():
        what = "is a folder, not a file" if file.is_dir() else "no such file"
        raise STAPOConfigError(f"{key}={path}: {what} ({PREPARE_HINT})")
    if file.suffix not in DATA_SUFFIXES:
        raise STAPOConfigError(f"{key}={path}: must be one of verl's data formats {list(DATA_SUFFIXES)}")
    if file.suffix == ".jsonl":
        return _check_jsonl(key, path, file, columns)
    if file.suffix != ".parquet":
        return f"{key}: {path}, exists (columns not checked for {file.suffix})"
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(file)
    except Exception as error:  # truncated, not parquet at all, unreadable
        raise STAPOConfigError(f"{key}={path}: not a readable parquet file ({type(error).__name__})") from None
    schema = parquet.schema_arrow
    missing = [f"{column} ({why})" for column, why in columns.items() if column not in schema.names]
    if missing:
        raise STAPOConfigError(
            f"{key}={path}: lacks column(s) {missing} that verl's loader and reward read (has {schema.names}); "
            f"{PREPARE_HINT}"
        )
    reward = schema.field("reward_model").type
    if hasattr(reward, "get_field_index") and reward.get_field_index("ground_truth") < 0:
        raise STAPOConfigError(f"{key}={path}: column reward_model has no ground_truth field (the reward reads it)")
    rows = parquet.metadata.num_rows
    if rows == 0:
        raise STAPOConfigError(f"{key}={path}: has no rows")
    _check_prompt_type(key, path, _prompt_column(columns), schema.field(_prompt_column(columns)).type)
    return f"{key}: {path}, parquet, {rows} rows"


# where a user's own file goes through: the paper's data sets by name, any JSON/JSONL/parquet/CSV by `custom`
PREPARE_HINT = ("`stapo data prepare` writes the paper's data sets; `stapo data prepare custom --input FILE "
                "--question-field F --answer-field F --out DIR` your own file (recipe/stapo/examples/README.md)")
PROMPT_FIX = ("verl applies the chat template to a list of messages, e.g. [{'role': 'user', 'content': '...'}]; "
              + PREPARE_HINT)


def _prompt_column(columns: dict[str, str]) -> str:
    return next((column for column, why in columns.items() if why == "data.prompt_key"), "prompt")


def _check_prompt_type(key: str, path: str, column: str, arrow_type) -> None:
    """The prompt column holds chat messages (a list of structs with role and content), as verl's loader reads it:
    a plain string passes every other check and fails in the workers' data loader."""
    import pyarrow as pa

    item = arrow_type.value_type if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type) else None
    if item is not None and pa.types.is_struct(item) and {"role", "content"} <= {field.name for field in item}:
        return
    what = "plain strings" if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type) else arrow_type
    raise STAPOConfigError(f"{key}={path}: column {column} holds {what}, not chat messages: {PROMPT_FIX}")


def _check_jsonl(key: str, path: str, file: Path, columns: dict[str, str]) -> str:
    """The first row of a JSON-lines file: the columns verl reads and the prompt's type (one line read)."""
    import json

    with file.open("r", encoding="utf-8", errors="replace") as handle:
        first = next((line for line in handle if line.strip()), None)
    if first is None:
        raise STAPOConfigError(f"{key}={path}: has no rows")
    try:
        row = json.loads(first)
    except json.JSONDecodeError as error:
        raise STAPOConfigError(f"{key}={path}: its first line is not JSON ({error.msg})") from None
    if not isinstance(row, dict):
        raise STAPOConfigError(f"{key}={path}: its first line is not a JSON object")
    missing = [f"{column} ({why})" for column, why in columns.items() if column not in row]
    if missing:
        raise STAPOConfigError(
            f"{key}={path}: lacks column(s) {missing} that verl's loader and reward read (has {list(row)}); "
            f"{PREPARE_HINT}"
        )
    prompt = row[_prompt_column(columns)]
    if not (isinstance(prompt, list) and prompt and all(isinstance(m, dict) and {"role", "content"} <= set(m)
                                                        for m in prompt)):
        what = "a plain string" if isinstance(prompt, str) else type(prompt).__name__
        raise STAPOConfigError(
            f"{key}={path}: column {_prompt_column(columns)} holds {what}, not chat messages: {PROMPT_FIX}"
        )
    return f"{key}: {path}, JSON lines (the first row's columns checked)"


def _required_columns(config) -> dict[str, str]:
    """The columns verl's RLHFDataset and reward manager read: the prompt, the data source, the ground truth."""
    prompt = OmegaConf.select(config, "data.prompt_key", default="prompt") or "prompt"
    source = OmegaConf.select(config, "data.reward_fn_key", default="data_source") or "data_source"
    return {prompt: "data.prompt_key", source: "data.reward_fn_key", "reward_model": "reward_model.ground_truth"}


def _generated_files(config) -> set[Path]:
    """The files ``prepare()`` writes before verl reads them (``stapo.synthetic_data_dir``)."""
    from stapo.data.tasks import TASKS

    folder = OmegaConf.select(config, "stapo.synthetic_data_dir", default=None)
    if not folder:
        return set()
    task = OmegaConf.select(config, "stapo.synthetic_task", default="synthetic")
    if task not in TASKS:
        raise STAPOConfigError(
            f"stapo.synthetic_task must be one of {list(TASKS)}, got {task!r}{did_you_mean(task, TASKS)}"
        )
    return {(Path(str(folder)).expanduser() / name).resolve() for name in TASKS[task][1]}
