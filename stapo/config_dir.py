"""Where the recipe's Hydra configs are: in the installed package, or in the checkout.

The configs live at the top of the repository (``conf/``, beside ``recipe/`` as in verl's
recipes). A wheel ships them as the package ``stapo.conf`` (``setup.py`` maps it to ``conf/``), so
``pip install .`` alone can run the recipe and the demo; an editable install or a checkout on
``PYTHONPATH`` reads ``conf/`` itself.
"""

from __future__ import annotations

from pathlib import Path

CONFIG_NAME = "stapo_trainer"


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
