"""Credentials in the environment never reach a logged config; a config that would carry one is refused.

verl prints the resolved config, writes it to the run folder (via the recipe) and passes it to
wandb/tensorboard, so the check is on the config itself: composed for real from
conf/stapo_trainer.yaml with tokens in the environment, resolved as the recipe resolves it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from stapo.algorithm.validation import STAPOConfigError
from stapo.credentials import MASK, find_secrets, redact, redact_text
from stapo.verl_plugin.preflight.run_checks import validate_run_config
from stapo.verl_plugin.training.loggers import wandb_env_defaults
from tests.recipe_config import config_for_verl, recipe_config

REPO = Path(__file__).resolve().parents[2]
ENV_VARS = "ray_kwargs.ray_init.runtime_env.env_vars"
SECRETS = {
    "WANDB_API_KEY": "wandb-0123456789abcdef0123456789abcdef",
    "HF_TOKEN": "hf_AbCdEfGhIjKlMnOpQrStUvWxYz012345",
    "AWS_SECRET_ACCESS_KEY": "aws/secret+value/0987654321",
    "MY_SERVICE_SECRET": "s3cr3t-s3cr3t-s3cr3t",
    "OPENAI_API_KEY": "sk-proj-abcdefghijklmnop",
}


@pytest.fixture
def secret_env(monkeypatch):
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    return SECRETS


def resolved(*overrides: str):
    """The config as the recipe hands it to verl (and verl to its loggers), resolved by the test itself."""
    return config_for_verl(*overrides, resolve=False)


@pytest.mark.parametrize("preset", ["tiny", "smollm2", "qwen3_1p7b", "qwen3_8b", "qwen3_14b"])
def test_composed_configs_hold_no_credential_from_the_environment(secret_env, preset):
    cfg = resolved(f"model_preset={preset}")
    validate_run_config(cfg)  # the driver check passes: nothing to refuse
    OmegaConf.resolve(cfg)
    text = OmegaConf.to_yaml(cfg)  # what config.yaml, verl's printout and wandb's config get
    for name, value in secret_env.items():
        assert value not in text, name
    assert find_secrets(OmegaConf.to_container(cfg)) == []


@pytest.mark.parametrize(
    "override, named",
    [
        (f"+{ENV_VARS}.HF_TOKEN=${{oc.env:HF_TOKEN}}", f"{ENV_VARS}.HF_TOKEN"),
        (f"+{ENV_VARS}.WANDB_KEY_COPY=" + SECRETS["WANDB_API_KEY"], "$WANDB_API_KEY"),
        ("trainer.experiment_name=run-" + SECRETS["MY_SERVICE_SECRET"],
         "trainer.experiment_name holds the value of $MY_SERVICE_SECRET"),
        ("+trainer.wandb_proxy=http://alice:hunter22@proxy.internal:3128",
         "trainer.wandb_proxy is a URL with a user:password"),
        (f"+{ENV_VARS}.GITHUB_TOKEN=ghp_literal_value_here", "env_vars.GITHUB_TOKEN looks like a credential"),
    ],
)
def test_config_carrying_a_credential_is_refused_without_echoing_it(secret_env, override, named):
    cfg = recipe_config("model_preset=tiny", override)
    with pytest.raises(STAPOConfigError) as error:
        validate_run_config(cfg)
    message = str(error.value)
    assert named in message and "export the variable" in message
    assert not any(value in message for value in secret_env.values())
    assert "hunter22" not in message and "ghp_literal_value_here" not in message


def test_redact_masks_values_keys_and_url_passwords(secret_env):
    tree = {
        "data": {"prompt_key": "prompt", "image_key": "images"},  # column names, not secrets
        "env_vars": {"HF_TOKEN": "anything-at-all", "OMP_NUM_THREADS": "1"},
        "note": f"token is {SECRETS['HF_TOKEN']} ok",
        "urls": ["https://bob:pa55word@host/x", "https://host/y"],
        "n": 3,
    }
    out = redact(tree)
    assert out["data"] == tree["data"] and out["env_vars"]["OMP_NUM_THREADS"] == "1" and out["n"] == 3
    assert out["env_vars"]["HF_TOKEN"] == MASK
    assert out["note"] == f"token is {MASK} ok"
    assert out["urls"] == [f"https://{MASK}@host/x", "https://host/y"]
    log = "\n".join(f"{k}={v}" for k, v in secret_env.items())
    cleaned = redact_text(log)
    assert not any(value in cleaned for value in secret_env.values()) and "HF_TOKEN=" + MASK in cleaned
    assert redact_text("short KEY=1 stays", {"SOME_KEY": "1"}) == "short KEY=1 stays"  # too short to match


def test_wandb_is_offline_unless_the_user_chose_a_mode(secret_env):
    """The paper presets log to wandb; with an API key in the environment wandb would go online."""
    qwen = resolved("model_preset=qwen3_8b")
    assert "wandb" in qwen.trainer.logger
    env_vars = qwen.ray_kwargs.ray_init.runtime_env.get("env_vars")
    assert wandb_env_defaults(qwen.trainer.logger, env_vars, environ={}) == {"WANDB_MODE": "offline"}
    assert wandb_env_defaults(qwen.trainer.logger, {}, environ={"WANDB_MODE": "online"}) == {}
    assert wandb_env_defaults(qwen.trainer.logger, {"WANDB_MODE": "online"}) == {}
    tiny = resolved("model_preset=tiny")
    assert "wandb" not in tiny.trainer.logger and wandb_env_defaults(tiny.trainer.logger, {}) == {}


@pytest.mark.slow  # starts processes: out of make test-fast
def test_recipe_process_refuses_a_token_in_the_runtime_env_before_ray(secret_env):
    env = dict(os.environ, HYDRA_FULL_ERROR="1")
    out = subprocess.run(
        [sys.executable, "-m", "recipe.stapo.main_stapo", "model_preset=tiny",
         "+ray_kwargs.ray_init.runtime_env.env_vars.HF_TOKEN=${oc.env:HF_TOKEN}"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=240,
    )
    both = out.stdout + out.stderr
    assert out.returncode != 0
    assert "ray_kwargs.ray_init.runtime_env.env_vars.HF_TOKEN holds the value of $HF_TOKEN" in out.stderr
    assert SECRETS["HF_TOKEN"] not in both and "Started a local Ray instance" not in both


LITERAL = "hf_abcdefghijklmnop1234"  # a token in no environment variable: only its key name gives it away


@pytest.mark.parametrize(
    "command",
    [
        # composes; refused by the recipe's check inside Hydra's job
        ["-m", "recipe.stapo.main_stapo", "model_preset=tiny", "stapo.run_dir=run", f"+{ENV_VARS}.HF_TOKEN={LITERAL}"],
        # no "+": Hydra's composition error, which would echo the value
        ["-m", "recipe.stapo.main_stapo", "model_preset=tiny", "stapo.run_dir=run", f"{ENV_VARS}.HF_TOKEN={LITERAL}"],
        # would print the config
        ["-m", "recipe.stapo.main_stapo", "model_preset=tiny", "stapo.run_dir=run", f"+{ENV_VARS}.HF_TOKEN={LITERAL}",
         "--cfg", "job"],
        # the demo's check of its runs, before the model is built or the task written
        ["-m", "stapo.cli", "demo", "--steps", "1", "--out", "demo", f"+{ENV_VARS}.HF_TOKEN={LITERAL}"],
        # the sweep's check of every cell, before the first run
        ["-m", "stapo.cli", "sweep", "--grid", "algo=stapo,grpo", "--out", "sweep", "--", "model_preset=tiny",
         f"+{ENV_VARS}.HF_TOKEN={LITERAL}"],
    ],
    ids=["run", "composition-error", "cfg-job", "demo", "sweep"],
)
@pytest.mark.slow  # starts processes: out of make test-fast
def test_a_literal_token_on_the_command_line_is_written_and_echoed_nowhere(tmp_path, command):
    """Hydra used to write overrides.yaml and config.yaml under outputs/<date>/<time>/.hydra/ and echo the
    overrides in "Error executing job with overrides"; the recipe's own refusal masked it too late."""
    out = subprocess.run(
        [sys.executable, *command],
        cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 2, out.stderr[-2000:]
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("stapo: ") and f"{ENV_VARS}.HF_TOKEN" in last, last
    assert LITERAL not in out.stdout + out.stderr and "Error executing job" not in out.stderr
    written = [path for path in tmp_path.rglob("*") if path.is_file()]
    assert not [path for path in written if LITERAL in path.read_text(errors="replace")], written
    assert not (tmp_path / "outputs").exists() and not list(tmp_path.rglob(".hydra"))
