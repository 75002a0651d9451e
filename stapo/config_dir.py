"""Where the recipe's Hydra configs are: in the installed package, or in the checkout.

The configs live at the top of the repository (``conf/``, beside ``recipe/`` as in verl's
recipes). A wheel ships them as the package ``stapo.conf`` (``setup.py`` maps it to ``conf/``), so
``pip install .`` alone can run the recipe and the demo; an editable install or a checkout on
``PYTHONPATH`` reads ``conf/`` itself.
"""

from __future__ import annotations

import re
from pathlib import Path

CONFIG_NAME = "stapo_trainer"
FOLDER_NAME_RESOLVER = "stapo.folder_name"


def folder_name(path) -> str:
    """``${stapo.folder_name:PATH}``: the last component of a model path (hub id, folder, ``stapo://NAME``, URL) as
    one safe folder name, for the default checkpoint folder (conf/stapo_trainer.yaml): ``Qwen/Qwen3-8B-Base`` ->
    ``Qwen3-8B-Base``."""
    last = str(path or "").rstrip("/").rsplit("/", 1)[-1]
    return re.sub(r"[^A-Za-z0-9._-]+", "_", last).strip("._") or "model"


def register_resolvers() -> None:
    """The recipe's own resolver, registered wherever the config is composed (every composer imports this module)."""
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver(FOLDER_NAME_RESOLVER):
        OmegaConf.register_new_resolver(FOLDER_NAME_RESOLVER, folder_name)


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
