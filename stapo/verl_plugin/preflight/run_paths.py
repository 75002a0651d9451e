"""Every folder a run writes to, made absolute once, in the driver, before anything reads it.

verl reads ``trainer.default_local_dir`` (and ``resume_from_path``) in its TaskRunner, a Ray actor: a relative
path meant the TaskRunner's working folder, which on a joined cluster is the head's, not the driver's. The folder
is also an interpolation of the model path (conf/stapo_trainer.yaml): left unresolved, it changed when the driver
replaced ``stapo://NAME`` by its cache folder, so the folder the driver checked was not the one verl saved to.
:func:`settle_run_paths` replaces each by its value now, absolute against the job's working folder (the driver's,
which is where a job's relative paths mean something), so every process is handed the same absolute path.
"""

from __future__ import annotations

import os

from omegaconf import OmegaConf, open_dict

# the run folder first: the checkpoint folder defaults to a folder inside it
PATH_KEYS = ("stapo.run_dir", "trainer.default_local_dir", "trainer.resume_from_path", "trainer.rollout_data_dir",
             "trainer.validation_data_dir")


def absolute_path(path, cwd: str | None = None) -> str:
    """``path`` as an absolute, normalised path against ``cwd`` (default this process's working folder), ``~``
    expanded; a URL (``hdfs://...``) as given."""
    text = str(path)
    if "://" in text:
        return text
    text = os.path.expanduser(text)
    return os.path.normpath(os.path.join(cwd or os.getcwd(), text))


def settle_run_paths(config, cwd: str | None = None) -> list[str]:
    """Each of :data:`PATH_KEYS` that is set, replaced in ``config`` by its absolute value (interpolations
    resolved now); returns ``key=value`` for each one changed."""
    changed = []
    for key in PATH_KEYS:
        value = OmegaConf.select(config, key, default=None)
        if value is None or value == "":
            continue
        settled = absolute_path(value, cwd)
        if settled != value:
            changed.append(f"{key}={settled}")
        with open_dict(config):
            OmegaConf.update(config, key, settled, force_add=True)
    return changed
