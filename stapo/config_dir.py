"""Where the recipe's Hydra configs are: in the installed package, or in the checkout.

The configs live at the top of the repository (``conf/``, beside ``recipe/`` as in verl's
recipes). A wheel ships them as the package ``stapo.conf`` (``setup.py`` maps it to ``conf/``), so
``pip install .`` alone can run the recipe and the demo; an editable install or a checkout on
``PYTHONPATH`` reads ``conf/`` itself.
"""

from __future__ import annotations

import functools
import importlib.util
import re
from pathlib import Path

CONFIG_NAME = "stapo_trainer"
FOLDER_NAME_RESOLVER = "stapo.folder_name"
CHECKPOINTS_RESOLVER = "stapo.checkpoints"


def folder_name(path) -> str:
    """``${stapo.folder_name:PATH}``: the last component of a model path (hub id, folder, ``stapo://NAME``, URL) as
    one safe folder name, for the default checkpoint folder (conf/stapo_trainer.yaml): ``Qwen/Qwen3-8B-Base`` ->
    ``Qwen3-8B-Base``."""
    last = str(path or "").rstrip("/").rsplit("/", 1)[-1]
    return re.sub(r"[^A-Za-z0-9._-]+", "_", last).strip("._") or "model"


def checkpoints_folder(run_dir, fallback) -> str:
    """``${stapo.checkpoints:RUN_DIR,FALLBACK}``: a run is one folder, so its checkpoints live in its run folder
    (``RUN_DIR/checkpoints``) where ``stapo.run_dir`` is set, and two run folders never share a checkpoint folder;
    without a run folder, ``FALLBACK`` (conf/stapo_trainer.yaml)."""
    return f"{str(run_dir).rstrip('/')}/checkpoints" if run_dir else str(fallback)


def register_resolvers() -> None:
    """The recipe's own resolver, registered wherever the config is composed (every composer imports this module)."""
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver(FOLDER_NAME_RESOLVER):
        OmegaConf.register_new_resolver(FOLDER_NAME_RESOLVER, folder_name)
    if not OmegaConf.has_resolver(CHECKPOINTS_RESOLVER):
        OmegaConf.register_new_resolver(CHECKPOINTS_RESOLVER, checkpoints_folder)


register_resolvers()


def config_dir() -> str:
    """Absolute path of the folder holding ``stapo_trainer.yaml`` and its groups."""
    package = Path(__file__).resolve().parent
    for candidate in (package / "conf", package.parent / "conf"):
        if (candidate / f"{CONFIG_NAME}.yaml").is_file():
            return str(candidate)
    raise FileNotFoundError(
        f"{CONFIG_NAME}.yaml is neither in {package / 'conf'} (installed package) nor in "
        f"{package.parent / 'conf'} (checkout): reinstall the project (pip install .)"
    )


# characters a folder's path may not hold to be given to Hydra as a quoted override value (a quote, an escape,
# an interpolation): such a folder keeps its pkg:// entry
UNQUOTABLE = ("'", "\\", "$")


def file_searchpath(entry: str) -> str:
    """``pkg://verl.trainer.config`` as ``file://<that folder>``, found without executing ``verl/__init__.py``:
    ``find_spec`` of a top-level name only locates the package, whereas Hydra's ``pkg://`` source imports it (verl's
    ``__init__`` imports torch, tensordict and torch._dynamo: seconds before a one-line refusal). The same YAML files
    either way; ``entry`` itself when it is not ``pkg://``, or the package is not a folder on disk (a zip)."""
    if not entry.startswith("pkg://"):
        return entry
    top, *rest = entry.removeprefix("pkg://").split(".")
    spec = importlib.util.find_spec(top)
    for location in (spec.submodule_search_locations or []) if spec else []:
        folder = Path(location, *rest)
        if folder.is_dir() and not any(char in str(folder) for char in UNQUOTABLE):
            return f"file://{folder}"
    return entry


@functools.cache
def searchpath_override() -> str | None:
    """A Hydra override giving ``stapo_trainer.yaml``'s own ``hydra.searchpath`` with each ``pkg://`` entry as its
    folder (:func:`file_searchpath`): composing then imports no package of the search path. None when no entry
    changes or one cannot be quoted (Hydra then reads the YAML's list). The YAML keeps ``pkg://`` (``hydra.main``
    and other users of the file compose as before). Worked out once a process: neither the YAML nor where verl is
    installed changes while it runs, and reading them took about 13 ms of every composition."""
    from omegaconf import OmegaConf

    primary = OmegaConf.load(Path(config_dir()) / f"{CONFIG_NAME}.yaml")
    entries = [str(entry) for entry in OmegaConf.select(primary, "hydra.searchpath", default=None) or []]
    folders = [file_searchpath(entry) for entry in entries]
    if folders == entries or any(char in entry for entry in folders for char in UNQUOTABLE):
        return None
    return "hydra.searchpath=[" + ",".join(f"'{entry}'" for entry in folders) + "]"
