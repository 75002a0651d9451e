"""``pip install .`` alone runs the recipe: the wheel carries the Hydra configs and the recipe finds them.

Built from a copy of the working tree (no build files in the checkout), without build isolation (no
index needed); the installed location is the unpacked wheel put first on ``PYTHONPATH`` of a fresh
interpreter run from an empty folder, so neither the checkout nor its editable install can answer.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

# builds a wheel and composes in fresh interpreters: about a minute on 2 cores, so not in `make test-fast`
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
ROOT_ONLY = {".git", ".venv", "build", "dist", "runs", "outputs"}  # run folders at the root, not stapo/runs/
ANYWHERE = shutil.ignore_patterns("__pycache__", "*.egg-info")


def skip(directory: str, names: list[str]) -> set[str]:
    skipped = set(ANYWHERE(directory, names))
    return skipped | (ROOT_ONLY & set(names) if Path(directory) == REPO else set())


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    source = tmp_path_factory.mktemp("src") / "stapo"
    shutil.copytree(REPO, source, ignore=skip)
    out = tmp_path_factory.mktemp("wheel")
    build = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out), "."]
    done = subprocess.run(build, cwd=source, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    (found,) = out.glob("stapo-*.whl")
    return found


def test_the_wheel_carries_every_config_and_the_recipe(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    configs = {f"stapo/conf/{path.relative_to(REPO / 'conf')}" for path in (REPO / "conf").rglob("*.yaml")}
    assert "stapo/conf/stapo_trainer.yaml" in configs and "stapo/conf/logger/all.yaml" in configs
    assert configs <= names, sorted(configs - names)
    modules = {"recipe/stapo/main_stapo.py", "stapo/config_dir.py", "stapo/verl_plugin/entry.py", "stapo/runs/train.py"}
    assert modules <= names


def test_the_installed_recipe_composes_from_the_installed_configs(wheel, tmp_path):
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = dict(os.environ, PYTHONPATH=str(site))
    probe = (
        "from hydra import compose, initialize_config_dir\n"
        "from recipe.stapo.main_stapo import CONF_DIR\n"
        "print(CONF_DIR)\n"
        "with initialize_config_dir(config_dir=CONF_DIR, version_base=None):\n"
        "    cfg = compose(config_name='stapo_trainer', overrides=['model_preset=qwen3_8b', 'logger=tensorboard'])\n"
        "print(cfg.actor_rollout_ref.model.path, list(cfg.trainer.logger))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], cwd=elsewhere, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    conf_dir, composed = done.stdout.strip().splitlines()[-2:]
    assert Path(conf_dir) == site / "stapo" / "conf"
    assert composed == "Qwen/Qwen3-8B-Base ['console', 'tensorboard']"
    # the entry point itself (Hydra's own composition, --cfg job stops before any preparation)
    job = subprocess.run([sys.executable, "-m", "recipe.stapo.main_stapo", "logger=all", "--cfg", "job"],
                         cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300)
    assert job.returncode == 0, job.stderr[-3000:]
    assert "path: stapo://tiny" in job.stdout and "- tensorboard" in job.stdout
