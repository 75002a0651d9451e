"""A checkpoint folder belongs to the run that saved into it: ``stapo_run.json`` in ``trainer.default_local_dir``.

verl resumes whatever ``trainer.default_local_dir`` holds (``trainer.resume_mode=auto``, verl's default) or the
``global_step_N`` folder of ``trainer.resume_from_path``: a run with another model, data, file or setting whose
folder happens to match resumes the earlier run's weights, silently when the shapes agree.

What a run is (:func:`run_identity`) is everything, less one named list: its whole resolved config as the driver
hands it to verl (presets applied, the user's rule in the preset's place, a ``stapo://`` model resolved to its
folder), flattened to dotted keys, without the keys of :data:`RESUMABLE` (each with the reason it may change on
resume), plus the sha256 of every file the run executes or reads as data (the rule and loss files, the reward
file, the data files, a local model's config and tokenizer files). A list of what matters would miss what nobody
thought of; a list of what may change is short, and each entry says why.

The record is written only by a run that saves into the folder, by the trainer at each of its saves
(:func:`begin_save`, :func:`end_save`), never before: a run that dies before its first save, or starts afresh
(``trainer.resume_mode=disable``) and never saves, leaves the folder's record as it was. A save marks its step as
being saved before verl writes anything and adds it to the record's steps once verl's tracker names it, so the
record and the checkpoint agree whenever the run is killed: the step verl would resume is the recorded run's only
when the record lists it (or it was being saved and verl's tracker moved to it). The driver, before Ray, compares
the step it would resume with the record (:func:`check_checkpoint_identity`) and refuses another run's, naming
each key that differs on a line of its own. ``stapo.resume_other_run=true`` resumes it on purpose; the folder
records the new run from its first save on.

A folder with checkpoints but no record (or the smaller record of an earlier version) is resumed with a warning
and adopted: its checkpoints cannot be told apart, only a folder named on purpose reaches it, and refusing would
stop every run of an earlier version from resuming.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import os
import time
import zlib
from pathlib import Path

from omegaconf import OmegaConf, open_dict

from stapo.algorithm.validation import STAPOConfigError
from stapo.credentials import redact
from stapo.files import sha256_file, write_text_atomically
from stapo.verl_plugin.preflight.run_paths import absolute_path, settle_run_paths

IDENTITY_FILE = "stapo_run.json"
OVERRIDE_KEY = "stapo.resume_other_run"
RECORD_KEY = "stapo.checkpoint_record"  # the driver's identity of the run, handed to the trainer that saves
TRACKER = "latest_checkpointed_iteration.txt"  # verl's checkpoint tracker (checkpoint_manager.py)
FORMAT = 2
MODEL_KEY = "actor_rollout_ref.model.path"
SHOWN = 12  # differing keys a refusal lists, one a line
VALUE_CHARS = 40

_STEPS = "the step and epoch counts: a resume asking more of them is how a run is extended"
_SAVES = "when checkpoints are saved and how many are kept"
_VALIDATION = "when validation runs and what it logs: measured, not trained"
_LOGS = "where metrics go and what the loggers call the run"
_CLUSTER = "the cluster's shape and how Ray starts on it (verl reshards a checkpoint onto another shape)"
_RESUME = "how this start resumes"
_FOLDERS = "the run's folders: where it writes, not what it does"
_DIAGNOSTICS = "diagnostic outputs written beside the metrics"
# the keys that may change on resume, each with its reason; every other key of the resolved config is the run
RESUMABLE = {
    "trainer.total_training_steps": _STEPS,
    "trainer.total_epochs": _STEPS,
    "trainer.save_freq": _SAVES,
    "trainer.max_actor_ckpt_to_keep": _SAVES,
    "trainer.max_critic_ckpt_to_keep": _SAVES,
    "trainer.esi_redundant_time": _SAVES,
    "trainer.test_freq": _VALIDATION,
    "trainer.val_before_train": _VALIDATION,
    "trainer.val_only": _VALIDATION,
    "trainer.log_val_generations": _VALIDATION,
    "trainer.logger": _LOGS,
    "trainer.project_name": _LOGS,
    "trainer.experiment_name": _LOGS,
    "actor_rollout_ref.rollout.trace": _LOGS + " (rollout traces)",
    "trainer.nnodes": _CLUSTER,
    "trainer.n_gpus_per_node": _CLUSTER,
    "trainer.ray_wait_register_center_timeout": _CLUSTER,
    "ray_kwargs": _CLUSTER + "; the processes' environment (the rule and loss files it names are recorded as files)",
    "stapo.weight_sync_timeout_s": "how long a weight sync may take before the run fails",
    "trainer.resume_mode": _RESUME,
    "trainer.resume_from_path": _RESUME,
    "trainer.del_local_ckpt_after_load": _RESUME,
    OVERRIDE_KEY: _RESUME,
    "stapo.run_dir": _FOLDERS,
    "trainer.default_local_dir": _FOLDERS,
    "trainer.default_hdfs_dir": _FOLDERS,
    "trainer.rollout_data_dir": _FOLDERS,
    "trainer.validation_data_dir": _FOLDERS,
    "global_profiler": "profiling: how long things take, not what they do",
    "stapo.spurious_log": _DIAGNOSTICS,
    "stapo.token_sample": _DIAGNOSTICS,
    "stapo.val_decodings": _DIAGNOSTICS,
    RECORD_KEY: "the record itself, handed from the driver to the trainer",
}
# what a local model folder's behaviour is read from besides its weights (the weights are the checkpoint's)
MODEL_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
               "special_tokens_map.json", "added_tokens.json", "vocab.json", "merges.txt", "tokenizer.model",
               "chat_template.jinja")
ABSENT = "absent"


class CheckpointOfAnotherRun(STAPOConfigError):
    """A refusal whose lines are one differing key each: kept as lines (``refusal_line``)."""

    keeps_lines = True


# --- what the run is ---------------------------------------------------------------------------------------------


def resumable(key: str) -> bool:
    return any(key == name or key.startswith(name + ".") for name in RESUMABLE)


def flatten(value, prefix: str = "") -> dict:
    """A nested container as ``{dotted.key: leaf}``; lists are leaves, an empty mapping is one."""
    if not isinstance(value, dict) or not value:
        return {prefix: value}
    flat = {}
    for key, item in value.items():
        flat.update(flatten(item, f"{prefix}.{key}" if prefix else str(key)))
    return flat


def run_identity(config) -> dict:
    """What the run is, as plain JSON values: ``config`` (the resolved config less :data:`RESUMABLE`, dotted keys)
    and ``files`` (absolute path: sha256 of each file the run executes or reads as data)."""
    # a credential is refused before a run starts (validate_run_config); masked here too: the record is a file
    values = flatten(redact(OmegaConf.to_container(config, resolve=True)))
    kept = {key: value for key, value in values.items() if not resumable(key)}
    identity = {"config": kept, "files": {path: file_digest(path) for path in run_files(config)}}
    return json.loads(json.dumps(identity, default=str))  # as read back from the file


def identity_digest(identity: dict) -> str:
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode("utf-8")).hexdigest()


def _listed(value) -> list[str]:
    if value is None or value == "":
        return []
    return [str(value)] if isinstance(value, str) else [str(item) for item in value]


def _expanded(path: str) -> list[str]:
    """A folder's files (a data folder), else the path itself; URLs are left to the config's record."""
    if "://" in path:
        return []
    if os.path.isdir(path):
        return sorted(str(file) for file in Path(path).rglob("*") if file.is_file())
    return [path]


def run_files(config) -> list[str]:
    """The absolute paths of what the run executes or reads as data, as this process reads them."""
    from stapo.verl_plugin.training.custom_rule import import_files, locate, rule_setting

    paths = []
    setting = rule_setting(config)
    if setting is not None:
        paths.append(setting.located())
    paths += [locate(given, fallback) for given, fallback in import_files(config)]
    paths += _listed(OmegaConf.select(config, "reward.custom_reward_function.path", default=None))
    for key in ("data.train_files", "data.val_files"):
        paths += _listed(OmegaConf.select(config, key, default=None))
    model = str(OmegaConf.select(config, MODEL_KEY, default="") or "")
    if model and "://" not in model and os.path.isdir(os.path.expanduser(model)):
        folder = os.path.expanduser(model)
        paths += [os.path.join(folder, name) for name in MODEL_FILES if os.path.isfile(os.path.join(folder, name))]
    found = [file for path in paths for file in _expanded(absolute_path(path.removeprefix("file://")))]
    return list(dict.fromkeys(found))


def file_digest(path: str) -> str:
    return sha256_file(Path(path)) if os.path.isfile(path) else ABSENT


def driver_view(config):
    """A copy of a composed config as the driver hands it to verl (what ``stapo check`` compares): its paths made
    absolute, the seeded loop pinned, the user's rule in the preset's place, a ``stapo://`` model as its folder."""
    from stapo.models.local import resolve_model_path
    from stapo.verl_plugin.reproducible.seeding import pin_reproducibility
    from stapo.verl_plugin.training.custom_rule import TOKEN_MASK_KEY, rule_setting

    view = copy.deepcopy(config)
    settle_run_paths(view)
    pin_reproducibility(view)
    with open_dict(view):
        if (setting := rule_setting(view)) is not None:
            OmegaConf.update(view, TOKEN_MASK_KEY, setting.registry_name, force_add=True)
        OmegaConf.update(view, MODEL_KEY, resolve_model_path(str(OmegaConf.select(view, MODEL_KEY))))
    OmegaConf.resolve(view)
    return view


# --- the record in the folder ------------------------------------------------------------------------------------


def tracker_step(folder: Path) -> int | None:
    """The step verl's tracker names, when its folder exists (verl's ``find_latest_ckpt_path``)."""
    try:
        step = int((folder / TRACKER).read_text().strip())
    except (OSError, ValueError):
        return None
    return step if (folder / f"global_step_{step}").is_dir() else None


def folder_to_resume(config) -> tuple[Path, int] | None:
    """The checkpoint folder the run would resume from and the step, when there is one; None otherwise."""
    mode = OmegaConf.select(config, "trainer.resume_mode", default="auto")
    if mode == "auto":
        folder = OmegaConf.select(config, "trainer.default_local_dir", default=None)
        if not folder or "://" in str(folder):
            return None
        folder = Path(absolute_path(folder))
        step = tracker_step(folder)
        return (folder, step) if step is not None else None
    if mode == "resume_path":
        path = OmegaConf.select(config, "trainer.resume_from_path", default=None)
        if not path or "://" in str(path) or "global_step_" not in str(path):
            return None
        path = Path(absolute_path(path))
        try:
            return path.parent, int(path.name.split("global_step_")[-1])
        except ValueError:
            return None
    return None


def read_record(folder: Path) -> dict | None:
    """The folder's record, None when it has none; an unreadable one is refused (delete it to adopt the folder)."""
    record = Path(folder) / IDENTITY_FILE
    if not record.is_file():
        return None
    try:
        data = json.loads(record.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise STAPOConfigError(
            f"{record}: unreadable ({type(error).__name__}); delete it to adopt the folder") from None
    return data if isinstance(data, dict) else {}


def unrecorded_step(record: dict, step: int) -> str | None:
    """Why ``step`` is not the recorded run's checkpoint; None when it is (listed, or its save reached verl's
    tracker, which had named another step when the save began)."""
    if step in record.get("steps", []):
        return None
    if step == record.get("saving"):
        if record.get("tracker_before") != step:
            return None
        return (f"global_step_{step}: a save of it by the recorded run was cut off over a checkpoint of the same "
                "step by an earlier run: it may be incomplete")
    return f"global_step_{step}: not saved by the run {IDENTITY_FILE} records (an earlier run of this folder's)"


_NOT_SET = object()


def short(value) -> str:
    text = "(not set)" if value is _NOT_SET else repr(value)
    return text if len(text) <= VALUE_CHARS else text[: VALUE_CHARS - 3] + "..."


def differing(recorded: dict, current: dict) -> list[str]:
    """One ``key: recorded -> now`` line per key (``file PATH`` for a file's sha256) that differs."""
    lines = []
    for section, label in (("config", ""), ("files", "file ")):
        old, new = recorded.get(section, {}), current.get(section, {})
        for key in sorted(set(old) | set(new)):
            before, after = old.get(key, _NOT_SET), new.get(key, _NOT_SET)
            if before != after:
                if section == "files":
                    before, after = (v[:12] if isinstance(v, str) and v != ABSENT else v for v in (before, after))
                lines.append(f"{label}{key}: {short(before)} -> {short(after)}")
    return lines


def _listing(lines: list[str], record: Path) -> str:
    shown = [f"  {line}" for line in lines[:SHOWN]]
    if len(lines) > SHOWN:
        shown.append(f"  ... and {len(lines) - SHOWN} more (the recorded run: {record})")
    return "\n".join(shown)


def check_checkpoint_identity(config, identity: dict | None = None) -> str | None:
    """Refused, naming what differs, when the run would resume another run's checkpoint; a note when it resumes its
    own (or an older folder without a record); None when it resumes nothing. ``identity``: the run's, from the
    driver's final config; else worked out from ``config`` as composed (:func:`driver_view`)."""
    found = folder_to_resume(config)
    if found is None:
        return None
    folder, step = found
    record = read_record(folder)
    if record is None or record.get("format") != FORMAT:
        what = f"no {IDENTITY_FILE}" if record is None else f"an earlier version's {IDENTITY_FILE}"
        return (f"warning: {folder} holds checkpoints but {what} (written before runs recorded themselves, or by "
                "verl's own entry point): resumed as this run's, and adopted at its first save")
    if identity is None:
        identity = run_identity(driver_view(config))
    problem = unrecorded_step(record, step)
    lines = [problem] if problem else differing(record.get("identity", {}), identity)
    if not lines:
        return f"checkpoints: resumes {folder}/global_step_{step}, saved by this run ({IDENTITY_FILE})"
    if OmegaConf.select(config, OVERRIDE_KEY, default=False) is True:
        return (f"checkpoints: resumes {folder}/global_step_{step}, saved by another run ({OVERRIDE_KEY}=true); "
                f"the folder records this run from its first save on; it differs in:\n"
                f"{_listing(lines, folder / IDENTITY_FILE)}")
    mode = OmegaConf.select(config, "trainer.resume_mode")
    raise CheckpointOfAnotherRun(
        f"trainer.default_local_dir={folder} holds checkpoints of another run, which trainer.resume_mode={mode} "
        f"would resume (global_step_{step}); set another stapo.run_dir or trainer.default_local_dir, "
        f"trainer.resume_mode=disable, or {OVERRIDE_KEY}=true to resume it on purpose; it differs in:\n"
        f"{_listing(lines, folder / IDENTITY_FILE)}"
    )


# --- handed to the trainer, written at its saves -----------------------------------------------------------------


def hand_to_trainer(config, identity: dict) -> None:
    """The driver's identity of the run, in the config verl's trainer receives (compressed: verl prints the
    config; base64: no ``${`` of a value is ever read as an interpolation)."""
    packed = base64.b64encode(zlib.compress(json.dumps(identity).encode("utf-8"), 9)).decode("ascii")
    with open_dict(config):
        OmegaConf.update(config, RECORD_KEY, packed, force_add=True)


def handed_identity(config) -> dict | None:
    packed = OmegaConf.select(config, RECORD_KEY, default=None)
    return json.loads(zlib.decompress(base64.b64decode(packed))) if packed else None


def _folder(config) -> Path | None:
    folder = OmegaConf.select(config, "trainer.default_local_dir", default=None)
    return Path(absolute_path(folder)) if folder and "://" not in str(folder) else None


def _write(folder: Path, record: dict) -> None:
    record["written"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    write_text_atomically(folder / IDENTITY_FILE, json.dumps(record, indent=1) + "\n")


def _own_record(folder: Path, identity: dict) -> dict:
    """The folder's record when it is this run's; else a new one, the replaced run kept as an earlier one."""
    digest = identity_digest(identity)
    try:
        old = read_record(folder) or {}
    except STAPOConfigError:
        old = {}
    if old.get("format") == FORMAT and old.get("sha256") == digest:
        return old
    earlier = [*old.get("earlier", []), {key: old.get(key) for key in ("sha256", "steps", "written")}] if old else []
    return {"format": FORMAT, "sha256": digest, "identity": identity, "steps": [], "earlier": earlier}


def begin_save(config, step: int) -> None:
    """Before verl writes ``step``: the record is this run's and marks the step as being saved (and the step verl's
    tracker names now, to tell a finished save from a cut-off one over a checkpoint of the same step)."""
    identity, folder = handed_identity(config), _folder(config)
    if identity is None or folder is None:
        return
    record = _own_record(folder, identity)
    tracker = tracker_step(folder)
    cut = record.get("saving")
    if cut is not None and cut == tracker and unrecorded_step(record, cut) is None:  # killed after verl's tracker
        record["steps"] = sorted({*record.get("steps", []), cut})
    record.update(saving=step, tracker_before=tracker)
    _write(folder, record)


def end_save(config, step: int) -> None:
    """After verl's tracker names ``step``: the step is the recorded run's."""
    identity, folder = handed_identity(config), _folder(config)
    if identity is None or folder is None:
        return
    record = _own_record(folder, identity)
    record.update(steps=sorted({*record.get("steps", []), step}), saving=None, tracker_before=None)
    _write(folder, record)
