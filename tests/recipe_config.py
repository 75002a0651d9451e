"""The recipe's config as the tests need it: composed by Hydra from the recipe's own config folder.

``recipe_config`` is what ``python -m recipe.stapo.main_stapo`` composes; ``config_for_verl`` is
that config as main_stapo hands it on: the hydra node dropped after Hydra's runtime values were
registered (``${hydra:runtime.choices.algo}`` in experiment names), optionally resolved.
"""

from __future__ import annotations

from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf, open_dict

from recipe.stapo.main_stapo import CONF_DIR
from stapo.config_dir import CONFIG_NAME


def recipe_config(*overrides: str):
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        return compose(config_name=CONFIG_NAME, overrides=list(overrides))


def config_for_verl(*overrides: str, resolve: bool = True):
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        cfg = compose(config_name=CONFIG_NAME, overrides=list(overrides), return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        del cfg["hydra"]
    if resolve:
        OmegaConf.resolve(cfg)
    return cfg
