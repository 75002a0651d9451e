"""Shared by the reward-check tests: the shipped example's rows prepared as a user prepares them, a composed
run config to point at a reward, and reward files written with known line numbers."""

from __future__ import annotations

import copy
import textwrap
from pathlib import Path

import pytest
from omegaconf import OmegaConf, open_dict

from stapo.check import compose_run
from stapo.cli import main as stapo_main

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "recipe" / "stapo" / "examples"
# the example's first three rows (recipe/stapo/examples/my_task.jsonl), what the check tries
FIRST_ANSWERS = ["42", "72", "63"]


@pytest.fixture(scope="session")
def example_parquet(tmp_path_factory) -> Path:
    """recipe/stapo/examples/my_task.jsonl through `stapo data prepare custom` (the README's command)."""
    out = tmp_path_factory.mktemp("my_task")
    assert stapo_main(["data", "prepare", "custom", "--input", str(EXAMPLES / "my_task.jsonl"), "--question-field",
                       "question", "--answer-field", "answer", "--template",
                       "Put the final answer in \\boxed{}. {question}", "--out", str(out)]) == 0
    return out / "train.parquet"


@pytest.fixture(scope="session")
def composed():
    """The paper's 8B preset as the recipe composes it (the reward keys are set per test)."""
    return compose_run(["model_preset=qwen3_8b", "trainer.nnodes=1"])


@pytest.fixture
def run_config(composed, example_parquet):
    """``run_config(path, name=..., **reward_kwargs)``: the composed config with the example's data and the reward."""

    def make(path, name="compute_score", data=None, **reward_kwargs):
        config = copy.deepcopy(composed)
        with open_dict(config):
            config.data.train_files = str(data or example_parquet)
            config.data.val_files = [str(data or example_parquet)]
            config.reward.custom_reward_function.path = None if path is None else str(path)
            config.reward.custom_reward_function.name = name
            if reward_kwargs:
                config.reward.custom_reward_function.reward_kwargs = OmegaConf.create(reward_kwargs)
        return config

    return make


@pytest.fixture
def reward_file(tmp_path):
    """``reward_file(source, name=...)``: ``source`` (dedented) written to a .py file; its path."""

    def write(source: str, name: str = "my_reward.py") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(source).lstrip("\n"), encoding="utf-8")
        return path

    return write
