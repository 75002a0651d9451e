"""A checkpoint folder belongs to the run that wrote it: ``stapo_run.json`` in ``trainer.default_local_dir``.

verl resumes whatever ``trainer.default_local_dir`` holds (``trainer.resume_mode=auto``, verl's default) or the
``global_step_N`` folder of ``trainer.resume_from_path``: a run with another model, data or settings whose folder
name happens to match resumes the earlier run's weights, silently when the shapes agree. The driver writes what
the run is (:func:`run_identity`: the model, the training files, the algorithm and the settings that change what
an update does) into the folder before training, and a run that would resume a folder written by another identity
is refused in one line naming the keys that differ. ``stapo.resume_other_run=true`` resumes it on purpose (a
deliberate change of learning rate, of data, ...); the folder then records the new identity.

Left out, so that resuming the same run works: the step and epoch counts (a resume asking more steps is the usual
way to extend a run), the save, validation and logging settings, the validation files, the cluster's shape.

A folder with checkpoints but no ``stapo_run.json`` (written before this file existed, or by verl's own entry
point) is resumed with a warning and adopted: its checkpoints cannot be told apart, the default folder name now
includes the model (conf/stapo_trainer.yaml), so only a folder named on purpose reaches it, and refusing would stop
every run of an earlier version from resuming.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from omegaconf import OmegaConf

from stapo.algorithm.validation import STAPOConfigError

IDENTITY_FILE = "stapo_run.json"
OVERRIDE_KEY = "stapo.resume_other_run"
TRACKER = "latest_checkpointed_iteration.txt"  # verl's checkpoint tracker (checkpoint_manager.py)
AR = "actor_rollout_ref"
# the settings that change what training does (besides the model, the files and the algorithm)
TRAINING_KEYS = (
    "data.train_batch_size", "data.max_prompt_length", "data.max_response_length", "data.seed", "data.shuffle",
    "data.prompt_key", "data.train_max_samples",
    f"{AR}.actor.policy_loss", f"{AR}.actor.clip_ratio", f"{AR}.actor.clip_ratio_low", f"{AR}.actor.clip_ratio_high",
    f"{AR}.actor.clip_ratio_c", f"{AR}.actor.loss_agg_mode", f"{AR}.actor.ppo_mini_batch_size",
    f"{AR}.actor.ppo_epochs", f"{AR}.actor.use_kl_loss", f"{AR}.actor.kl_loss_coef", f"{AR}.actor.kl_loss_type",
    f"{AR}.actor.entropy_coeff", f"{AR}.actor.optim.lr", f"{AR}.actor.optim.weight_decay",
    f"{AR}.actor.optim.lr_warmup_steps", f"{AR}.actor.optim.lr_scheduler_type", f"{AR}.actor.optim.optimizer",
    f"{AR}.actor.optim.optimizer_impl",
    f"{AR}.rollout.n", f"{AR}.rollout.temperature", f"{AR}.rollout.top_p", f"{AR}.rollout.top_k",
    f"{AR}.rollout.seed",
    "algorithm.adv_estimator", "algorithm.norm_adv_by_std_in_grpo", "algorithm.use_kl_in_reward",
    "reward.custom_reward_function.path", "reward.custom_reward_function.name",
    "stapo.custom_rule", "stapo.import_files",  # a user's token rule or loss file (docs/algorithm.md section 10)
)


def _local(path) -> str:
    """A local path that exists as an absolute path (the same file from another working folder); else as given."""
    text = str(path)
    if "://" in text:
        return text
    file = Path(text).expanduser()
    return str(file.resolve()) if file.exists() else text


def _algo() -> str | None:
    try:
        from hydra.core.hydra_config import HydraConfig

        return str(HydraConfig.get().runtime.choices.get("algo"))
    except Exception:  # composed without Hydra's runtime (a test's plain config)
        return None


def run_identity(config, algo: str | None = None) -> dict:
    """What the run is, as plain JSON values: the model, the training files, the algorithm, the settings."""
    files = OmegaConf.select(config, "data.train_files", default=None)
    identity = {
        f"{AR}.model.path": _local(OmegaConf.select(config, f"{AR}.model.path")),
        "data.train_files": [_local(path) for path in ([files] if isinstance(files, str) else list(files or []))],
        "algo": algo if algo is not None else _algo(),
    }
    for key in TRAINING_KEYS:
        value = OmegaConf.select(config, key, default=None)
        identity[key] = OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
    reward = identity["reward.custom_reward_function.path"]
    identity["reward.custom_reward_function.path"] = _local(reward) if reward else reward
    return json.loads(json.dumps(identity, default=str))  # as read back from the file


def folder_to_resume(config) -> Path | None:
    """The checkpoint folder the run would resume from, when it holds a checkpoint; None otherwise."""
    mode = OmegaConf.select(config, "trainer.resume_mode", default="auto")
    if mode == "auto":
        folder = OmegaConf.select(config, "trainer.default_local_dir", default=None)
        if not folder or "://" in str(folder):
            return None
        folder = Path(str(folder)).expanduser()
        return folder if (folder / TRACKER).is_file() or any(folder.glob("global_step_*")) else None
    if mode == "resume_path":
        step = OmegaConf.select(config, "trainer.resume_from_path", default=None)
        return Path(str(step)).expanduser().parent if step and "://" not in str(step) else None
    return None


def differing(recorded: dict, current: dict) -> list[str]:
    """The keys whose values differ, each ``key: recorded -> current``."""
    keys = sorted(set(recorded) | set(current))
    return [f"{key}: {recorded.get(key)!r} -> {current.get(key)!r}" for key in keys
            if recorded.get(key) != current.get(key)]


def check_checkpoint_identity(config, algo: str | None = None) -> str | None:
    """Refused in one line when the run would resume another run's checkpoint; a note when it resumes its own (or
    an older folder without a record); None when it resumes nothing."""
    folder = folder_to_resume(config)
    if folder is None:
        return None
    record = folder / IDENTITY_FILE
    if not record.is_file():
        return (f"warning: {folder} holds checkpoints but no {IDENTITY_FILE} (written before runs recorded "
                "themselves, or by verl's own entry point): resumed as this run's, and adopted")
    try:
        recorded = json.loads(record.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise STAPOConfigError(
            f"{record}: unreadable ({type(error).__name__}); delete it to adopt the folder") from None
    changes = differing(recorded.get("identity", {}), run_identity(config, algo))
    if not changes:
        return f"checkpoints: resumes {folder}, written by this run ({IDENTITY_FILE})"
    if OmegaConf.select(config, OVERRIDE_KEY, default=False) is True:
        return f"checkpoints: resumes {folder}, written by another run ({OVERRIDE_KEY}=true): {'; '.join(changes)}"
    raise STAPOConfigError(
        f"trainer.default_local_dir={folder} holds checkpoints of another run, which trainer.resume_mode="
        f"{OmegaConf.select(config, 'trainer.resume_mode')} would resume: {'; '.join(changes)}; set another "
        f"trainer.default_local_dir, trainer.resume_mode=disable, or {OVERRIDE_KEY}=true to resume it on purpose"
    )


def write_identity(config, algo: str | None = None) -> str | None:
    """The driver's record, before training, in the folder verl saves to (when it saves or resumes): this run's
    identity, and the identities it replaced (a deliberate resume of another run, or a fresh start). A note when
    written; a warning when the folder cannot be written from here (the driver's node may not mount it: verl's
    workers save there, and the check needs the record)."""
    save_freq = OmegaConf.select(config, "trainer.save_freq", default=-1) or -1
    folder = OmegaConf.select(config, "trainer.default_local_dir", default=None)
    if not folder or "://" in str(folder) or (save_freq <= 0 and folder_to_resume(config) is None):
        return None
    folder = Path(str(folder)).expanduser()
    record = folder / IDENTITY_FILE
    identity = run_identity(config, algo)
    earlier = []
    if record.is_file():
        try:
            old = json.loads(record.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            old = {}
        if old.get("identity") == identity:
            return None
        earlier = [*old.get("earlier", []), {"identity": old.get("identity"), "written": old.get("written")}]
    try:
        folder.mkdir(parents=True, exist_ok=True)
        text = json.dumps({"identity": identity, "written": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                           "earlier": earlier}, indent=1)
        record.write_text(text + "\n", encoding="utf-8")
    except OSError as error:
        return (f"warning: {record} not written ({error.strerror or type(error).__name__}): a later run cannot tell "
                "this run's checkpoints from another's")
    return f"checkpoints: {folder}, this run recorded in {IDENTITY_FILE}"
