"""``stapo.check.compose_run`` composes without importing verl, and composes the same config as before (issue 62).

``conf/stapo_trainer.yaml`` finds verl's configs through ``pkg://verl.trainer.config``, whose Hydra source imports
verl (torch, tensordict, torch._dynamo: seconds on a 2-core machine); ``compose_run`` gives Hydra the same folder as
``file://`` (``stapo.config_dir.searchpath_override``), so a setting refused by the composition or by a check that
needs no verl is reported before verl loads. Real Hydra, real verl config files, a real fresh interpreter.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf, open_dict

from stapo.algorithm.validation import STAPOConfigError
from stapo.check import compose_run, composed_choices, explain_composition_error
from stapo.config_dir import CONFIG_NAME, config_dir, file_searchpath, searchpath_override

REPO = Path(__file__).resolve().parents[2]

OVERRIDE_SETS = [
    [],
    ["model_preset=tiny"],
    ["model_preset=testbed", "algo=grpo"],
    ["model_preset=qwen3_8b", "algo=dapo", "logger=tensorboard"],
    ["model_preset=qwen3_1p7b_1node", "algo=cispo"],
    ["model_preset=smollm2", "algo=lopti", "logger=all"],
    ["model_preset=tiny", "algo=gspo", "+trainer.a_new_key=1", "data.train_batch_size=8"],
    ["model_preset=tiny", "model_engine=megatron"],  # one of verl's own groups, read from its folder
]


def compose_with_pkg(overrides: list[str]):
    """The composition as ``hydra.main`` does it: the YAML's ``pkg://verl.trainer.config`` (which imports verl)."""
    with initialize_config_dir(config_dir=config_dir(), version_base=None):
        cfg = compose(config_name=CONFIG_NAME, overrides=list(overrides), return_hydra_config=True)
    choices = dict(cfg.hydra.runtime.choices)
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg, choices


def test_the_override_replaces_the_pkg_entry_by_verls_config_folder():
    override = searchpath_override()
    assert override is not None and "pkg://" not in override, override
    folder = override.split("'")[1].removeprefix("file://")
    assert (Path(folder) / "ppo_trainer.yaml").is_file(), folder
    assert Path(folder).parent.parent.name == "verl", folder
    assert file_searchpath("file:///elsewhere") == "file:///elsewhere"
    assert file_searchpath("pkg://no_such_package_here.config") == "pkg://no_such_package_here.config"


def test_a_folder_hydra_cannot_take_quoted_keeps_its_pkg_entry(tmp_path, monkeypatch):
    for parent, name in ((tmp_path / "plain", "plainpkg"), (tmp_path / "it's", "quotedpkg")):
        (parent / name / "conf").mkdir(parents=True)
        (parent / name / "__init__.py").write_text("raise ImportError('never imported')\n")
        monkeypatch.syspath_prepend(str(parent))
    assert file_searchpath("pkg://plainpkg.conf") == f"file://{tmp_path / 'plain' / 'plainpkg' / 'conf'}"
    assert file_searchpath("pkg://quotedpkg.conf") == "pkg://quotedpkg.conf"
    assert "plainpkg" not in sys.modules and "quotedpkg" not in sys.modules


@pytest.mark.parametrize("overrides", OVERRIDE_SETS, ids=lambda o: " ".join(o) or "defaults")
def test_compose_run_gives_the_config_the_pkg_search_path_gives(overrides):
    ours = compose_run(overrides)
    our_choices = composed_choices()
    theirs, their_choices = compose_with_pkg(overrides)
    assert OmegaConf.to_container(ours, resolve=False) == OmegaConf.to_container(theirs, resolve=False)
    assert our_choices == {key: str(value) for key, value in their_choices.items() if not key.startswith("hydra")}


@pytest.mark.parametrize(
    "overrides",
    [["model_preset=qwen3_8"], ["model_engine=no_such_engine"], ["actor_rollout_ref.actor.policy_los.x=1"],
     ["+trainer.nnodes=2"]],
    ids=["our-preset", "verls-group", "unknown-key", "plus-for-existing"],
)
def test_hydras_errors_and_their_refusals_are_the_same_both_ways(overrides):
    """The refusal's options (``choose one of [...]``) come from Hydra's text, which lists them from the sources;
    only the search path Hydra appends to a missing option's text names the other source."""
    ours, theirs = hydra_error(compose_with_file, overrides), hydra_error(compose_with_pkg, overrides)
    assert without_search_path(text_of(ours)) == without_search_path(text_of(theirs))
    with pytest.raises(STAPOConfigError) as refused:
        compose_run(overrides)
    assert str(refused.value) == explain_composition_error(theirs, overrides)


def compose_with_file(overrides: list[str]):
    """compose_run's composition, Hydra's error not yet turned into one line."""
    with initialize_config_dir(config_dir=config_dir(), version_base=None):
        return compose(config_name=CONFIG_NAME, overrides=[*overrides, searchpath_override()])


def hydra_error(compose_fn, overrides: list[str]) -> Exception:
    try:
        compose_fn(overrides)
    except Exception as error:  # noqa: BLE001 (Hydra's exceptions, as compose_run catches them)
        return error
    raise AssertionError(f"{overrides} composed")


def text_of(error: Exception) -> str:
    return f"{error}\n{error.__cause__ or ''}"


def without_search_path(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if "provider=" not in line)


def test_a_users_own_search_path_is_kept():
    """Given with the overrides, ``hydra.searchpath`` is the user's (Hydra would refuse two values for it)."""
    own = compose_run(["model_preset=tiny", "hydra.searchpath=[pkg://verl.trainer.config]"])
    from hydra.core.hydra_config import HydraConfig

    assert list(HydraConfig.get().searchpath) == ["pkg://verl.trainer.config"]
    assert OmegaConf.to_container(own) == OmegaConf.to_container(compose_run(["model_preset=tiny"]))


COMPOSE_IN_A_FRESH_PROCESS = """
import json, sys
from omegaconf import OmegaConf
from stapo.check import compose_run, composed_choices, explain_composition_error
config = compose_run(["model_preset=tiny"])
resolved = OmegaConf.to_container(config, resolve=True)  # every resolver it needs is registered without verl
print(json.dumps({"loaded": [name for name in ("verl", "torch._dynamo", "torch") if name in sys.modules],
                  "folder": resolved["trainer"]["default_local_dir"]}))
"""


@pytest.mark.slow  # starts a process: out of make test-fast
def test_composing_in_a_fresh_process_imports_neither_verl_nor_torch_dynamo():
    out = subprocess.run([sys.executable, "-c", COMPOSE_IN_A_FRESH_PROCESS], cwd=REPO, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["loaded"] == [], report
    # ${stapo.folder_name:...} (the recipe's resolver) and ${hydra:runtime.choices.algo} resolved
    assert report["folder"].endswith("-tiny") and "${" not in report["folder"], report


# one process for the cases below, in their order: the verl-free refusals first, each leaving verl's trainer
# modules unimported, then the registries' check, which imports them
REFUSE_IN_A_FRESH_PROCESS = """
import json, sys
from stapo.algorithm.validation import STAPOConfigError
from stapo.check import compose_run
from stapo.preset_fit import check_preset_fit
reports = []
for override in json.loads(sys.argv[1]):
    config = compose_run(["model_preset=tiny", override])
    check_preset_fit(config)
    loaded = "verl" in sys.modules
    from stapo.verl_plugin.preflight.run_checks import validate_run_config
    try:
        validate_run_config(config)
        refusal = None
    except STAPOConfigError as error:
        refusal = str(error)
    reports.append({"verl_before_checks": loaded, "refusal": refusal,
                    "trainer_modules": "verl.trainer.ppo.v1.trainer_base" in sys.modules})
print(json.dumps(reports))
"""
REFUSALS = [  # (override, the refusal's start, verl's trainer modules imported by then)
    ("stapo.weight_sync_timeout_s=0", "stapo.weight_sync_timeout_s must be a number of seconds > 0", False),
    ("trainer.logger=[consol]", "trainer.logger='consol' is not one of verl's loggers", False),
    ("trainer.total_training_steps=-1", "trainer.total_training_steps must be a positive integer", False),
    ("actor_rollout_ref.actor.policy_loss.loss_mode=stpo", "actor_rollout_ref.actor.policy_loss.loss_mode must be "
     "one of", True),
]


@pytest.mark.slow  # starts a process: out of make test-fast
def test_a_check_that_needs_no_verl_trainer_module_refuses_before_one_is_imported():
    """stapo/verl_plugin/preflight/run_checks.py validate_run_config: the verl-free checks first. The preset's fit
    and the composition import no verl at all; the registries' check does import verl's trainer modules. One fresh
    process for every case (a verl-free refusal leaves the process without verl's trainer modules, so the next case
    starts as a fresh process would for them)."""
    out = subprocess.run([sys.executable, "-c", REFUSE_IN_A_FRESH_PROCESS, json.dumps([o for o, _, _ in REFUSALS])],
                         cwd=REPO, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    reports = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(reports) == len(REFUSALS)
    assert reports[0]["verl_before_checks"] is False, reports  # composing and the preset's fit: no verl
    for (override, refusal, trainer_modules), report in zip(REFUSALS, reports):
        assert (report["refusal"] or "").startswith(refusal), (override, report)
        assert report["trainer_modules"] is trainer_modules, (override, report)


PL = "actor_rollout_ref.actor.policy_loss"


@pytest.mark.parametrize(
    "overrides, refusal",
    [
        # cispo's preset sets clip_ratio_low 10, which only loss_mode=cispo allows: the misspelt name is the message
        (["algo=cispo", f"{PL}.loss_mode=cispoo"], f"{PL}.loss_mode must be one of"),
        # a misspelt trainer would also fail the token mask's "needs trainer.v1.trainer_mode=stapo"
        (["algo=stapo", "trainer.v1.trainer_mode=stpo"], "trainer.v1.trainer_mode must be one of"),
        # geo_mean with a weighting mask: the mask's message, not geo_mean's micro-batch one
        (["algo=taco", f"{PL}.loss_mode=geo_mean"], f"{PL}.token_mask=taco weights each token's"),
        # a credential under a key another check refuses: that check's message (the secrets' check is last)
        ([f"+{PL}.hf_token=hf_abcdefghijklmnop1234"], f"{PL} has unknown key(s)"),
        # the lengths are checked before the batch check reads them as numbers (it raised ValueError before)
        (["data.max_response_length=abc"], "data.max_response_length must be a positive integer, got 'abc'"),
        (["algo=stapo", "actor_rollout_ref.actor.ppo_epochs=abc"], "actor_rollout_ref.actor.ppo_epochs must be a "
         "positive integer, got 'abc'"),
    ],
)
def test_one_mistake_gets_the_message_of_its_own_check(overrides, refusal):
    """The order's constraints (validate_run_config's docstring), each on a config with one mistake."""
    from stapo.verl_plugin.preflight.run_checks import validate_run_config

    with pytest.raises(STAPOConfigError) as refused:
        validate_run_config(compose_run(["model_preset=tiny", *overrides]))
    assert str(refused.value).startswith(refusal), str(refused.value)
