"""`stapo check OVERRIDE ...`: the recipe's config, composed and checked as a run would, without a run.

One check for every entry point (the recipe, ``stapo demo``, ``stapo sweep``, ``stapo doctor``):
:func:`compose_run` composes ``conf/stapo_trainer.yaml`` with Hydra exactly as
``python -m recipe.stapo.main_stapo`` does, turning Hydra's composition errors (a misspelt key, an
unknown preset) into one line with a did-you-mean; :func:`check_run` runs the driver's checks of the
settings (``validate_run_config``) and of what the run reads (``stapo.input_checks``). A refusal is a
:class:`STAPOConfigError`: ``stapo: <message>`` on stderr and exit code 2, everywhere.
"""

from __future__ import annotations

import argparse
import os
import re
import warnings

from stapo.algorithm.validation import STAPOConfigError, did_you_mean

# the key an override sets, adds or deletes: key=v, +key=v, ++key=v, ~key=v, ~key
OVERRIDE_KEY = re.compile(r"^[~+]*([^=~+][^=]*)(?:=|$)")


def quiet_optional_engines() -> None:
    """Importing verl warns once per optional training engine that is not installed (torchtitan, megatron,
    ...): five tracebacks' worth of lines above a one-line refusal. Called first by each entry point."""
    warnings.filterwarnings("ignore", message=r".* engine is not available", category=UserWarning)


# the files a run loads, by the key that names them: one path each, or a list of them
FILE_KEYS = ("stapo.custom_rule.path", "reward.custom_reward_function.path")
FILE_LIST_KEYS = ("stapo.import_files",)


def absolute_file_overrides(overrides: list[str]) -> tuple[list[str], list[str]]:
    """``overrides`` with each relative path of a file the run loads (the rule, the loss files, the reward) made
    absolute here, and a note for each: one policy for the three at every front door (``stapo check``, ``stapo
    train``, a local ``stapo sweep``), so a path means the file the command's folder holds, the one the check reads,
    wherever the run's processes start (a sweep's cells start in their run folders). ``pkg://`` names, other
    schemes and interpolations are left alone; the recipe run by hand keeps each key's own rule (docs/algorithm.md
    section 10)."""
    done, notes = [], []
    for override in overrides:
        key, (prefix, _, value) = _override_key(override), override.partition("=")
        new = value
        if key in FILE_KEYS:
            new = _absolute(value)
        elif key in FILE_LIST_KEYS and value.startswith("[") and value.endswith("]"):
            items = [item.strip().strip("'\"") for item in value[1:-1].split(",") if item.strip()]
            if any(_absolute(item) != item for item in items):
                new = "[" + ",".join(_absolute(item) for item in items) + "]"
        if new != value:
            notes.append(f"{key}: a relative path, taken from this folder as {new}")
        done.append(override if new == value else f"{prefix}={new}")
    return done, notes


def _absolute(value: str) -> str:
    if value in ("", "null", "None") or value.startswith("${") or ("://" in value and not value.startswith("file://")):
        return value
    local = value.removeprefix("file://")
    if os.path.isabs(local):
        return value
    return os.path.abspath(os.path.expanduser(local))


def compose_run(overrides: list[str]):
    """The recipe's config for ``overrides``, the hydra node dropped after ``${hydra:...}`` was made resolvable.

    verl's configs are read from their folder (``stapo.config_dir.searchpath_override``), not through the YAML's
    ``pkg://verl.trainer.config``, which imports verl: a refused setting or preset is reported before verl's
    seconds of imports (tests/unit/test_compose_without_verl.py: the same config either way). A user's own
    ``hydra.searchpath=`` override is kept as given."""
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    from stapo.config_dir import CONFIG_NAME, config_dir, searchpath_override

    searchpath = searchpath_override()
    own = [searchpath] if searchpath and "hydra.searchpath" not in map(_override_key, overrides) else []
    try:
        with initialize_config_dir(config_dir=config_dir(), version_base=None):
            cfg = compose(config_name=CONFIG_NAME, overrides=[*overrides, *own], return_hydra_config=True)
    except Exception as error:  # Hydra's composition and override-grammar errors
        raise STAPOConfigError(explain_composition_error(error, overrides)) from None
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg


def check_run(config, paths: bool = True, launch: bool = False, show_calls: bool = True) -> list[str]:
    """Every driver-side check of a composed config; the notes of the path checks (what each path was taken as).
    A CPU preset given another model, data or device is refused first: the other refusals would be about it.
    With ``paths`` this machine's GPUs and the checkpoint folder are checked too; ``launch`` (``stapo train``: the
    run starts from here) refuses what ``stapo check`` only notes (a GPU run on a machine without a GPU);
    ``show_calls``: a line for each call of the reward as it returns."""
    from stapo.input_checks import check_inputs
    from stapo.preset_fit import check_preset_fit

    check_preset_fit(config)  # imports no verl: stapo.verl_plugin's modules are imported after it
    from stapo.verl_plugin.preflight.checkpoint_identity import check_checkpoint_identity
    from stapo.verl_plugin.preflight.cluster_shape import check_cluster_shape
    from stapo.verl_plugin.preflight.run_checks import validate_run_config

    validate_run_config(config)
    shape = check_cluster_shape(config, here=paths, launch=launch)
    shape += [note for note in [check_checkpoint_identity(config) if paths else None] if note]
    from stapo.verl_plugin.preflight.reward_check import check_reward

    return (check_inputs(config) if paths else []) + check_reward(config, paths, show_calls) + shape


def explain_composition_error(error: Exception, overrides: list[str]) -> str:
    """One line for Hydra's composition error: the key or preset, with the closest existing ones.

    Hydra's own text suggests adding a misspelt key with ``+`` and echoes the override's value (a
    token, possibly): neither is repeated here.
    """
    from stapo.credentials import MASK, SECRET_CONFIG_KEY, redact_text

    text = str(error) + "\n" + str(error.__cause__ or "")
    present = re.search(r"An item is already at '([^']+)'|Multiple values for ([\w.]+)\. To override", text)
    if present:  # +key=value for a key the config has: Hydra's text is three lines; the fix is one word
        key = present.group(1) or present.group(2)
        return f"+{key}=...: drop the + : {key} exists in the config (+ adds a new key; {key}=VALUE sets it)"
    missing_key = re.search(r"Could not override '([^']+)'", text)
    if missing_key and ("not in struct" in text or "No match in the defaults list" in text):
        return _unknown_key(missing_key.group(1), overrides)
    missing_option = re.search(r"Could not find '([^']+)/([^'/]+)'", text)
    if missing_option:
        group, option = missing_option.groups()
        options = [name for name in re.findall(r"^\t(\S+)$", text, flags=re.MULTILINE) if not name.startswith("_")]
        return f"{group}={option}: no such preset, choose one of {options}{_preset_hint(group, option, options)}"
    first = next((line.strip() for line in text.splitlines() if line.strip()), type(error).__name__)
    for override in overrides:  # a value under a credential-like key is never echoed, even malformed
        key, _, value = override.partition("=")
        if value and SECRET_CONFIG_KEY.search(key.rsplit(".", 1)[-1]):
            first = first.replace(value, MASK)
    return redact_text(f"cannot compose the config: {first}")


# where a user whose model size has no preset is sent (the refusal of an unknown model_preset names it)
NEW_SIZE_DOC = 'docs/one-node.md ("A preset for another model size")'


def _preset_hint(group: str, option: str, options: list[str]) -> str:
    """The did-you-mean for a misspelt option (``qwen3_8`` -> ``qwen3_8b``); none when the closest option names
    other numbers (``qwen3_4b`` is not a typo of ``qwen3_14b``: a size that has no preset). An unknown model
    preset without a close one points to the doc that says how to make a preset for another model size."""
    hint = did_you_mean(option, options)
    if group != "model_preset":
        return hint
    close = re.search(r"'([^']*)'", hint)
    if close and re.findall(r"\d+", close.group(1)) != re.findall(r"\d+", option):
        hint = ""
    return hint or f"; for a model size without a preset see {NEW_SIZE_DOC}"


def _unknown_key(key: str, overrides: list[str]) -> str:
    """``key`` is not in the config: the closest key at the level where its path leaves the config."""
    from omegaconf import DictConfig

    others = [item for item in overrides if _override_key(item) != key]
    try:
        node = compose_run(others)
    except STAPOConfigError:
        node = None
    parts, found = key.split("."), []
    for part in parts:
        if not isinstance(node, DictConfig) or part not in node:
            break
        node, found = node[part], [*found, part]
    prefix = ".".join(found)
    hint = " (a new key takes a leading +; `stapo check --print` shows the config)"
    if isinstance(node, DictConfig) and len(found) < len(parts):
        keys = [str(name) for name in node.keys()]
        close = did_you_mean(parts[len(found)], keys)
        if close:
            hint = close.replace("'", f"'{prefix}." if prefix else "'", 1)
    where = f"a key of {prefix}" if prefix else "a top-level key"
    return f"{key}: not {where}{hint}"


def _override_key(override: str) -> str:
    match = OVERRIDE_KEY.match(override)
    return match.group(1) if match else override


def main(argv: list[str]) -> int:
    quiet_optional_engines()
    parser = argparse.ArgumentParser(
        prog="stapo check",
        description="Compose the recipe's config from OVERRIDEs as `python -m recipe.stapo.main_stapo` does and run "
        "every check the recipe runs before Ray (settings, model path, data files); exit 0 (OK) or 2 (refused).",
    )
    parser.add_argument("overrides", nargs="*", metavar="OVERRIDE", help="the recipe's Hydra overrides, key=value")
    parser.add_argument("--print", dest="print_config", action="store_true", help="print the resolved config")
    parser.add_argument("--no-paths", action="store_true",
                        help="check the settings only, not the model and data paths, this machine's GPUs or the "
                        "checkpoint folder (a cluster's config on a laptop)")
    args = parser.parse_args(argv)
    overrides, path_notes = absolute_file_overrides(args.overrides)
    config = compose_run(overrides)
    choices = composed_choices()
    notes = path_notes + check_run(config, paths=not args.no_paths)
    from stapo.verl_plugin.preflight.custom_rule_check import check_custom_files

    if (checked := check_custom_files(config)) is not None:  # checked by check_run already: its note
        notes.append(checked.note())
    if args.print_config:
        print(resolved_yaml(config), end="")
    for note in notes:
        print(f"[stapo] {note}")
    for line in run_summary(config, choices):
        print(f"[stapo] {line}")
    print("OK")
    return 0


def composed_choices() -> dict[str, str]:
    """The config groups' options of the last :func:`compose_run` (``model_preset``, ``algo``, ``logger``)."""
    from hydra.core.hydra_config import HydraConfig

    choices = HydraConfig.get().runtime.choices
    return {str(group): str(option) for group, option in choices.items() if not str(group).startswith("hydra")}


def run_summary(config, choices: dict[str, str]) -> list[str]:
    """The values a user looks at first, resolved: which preset, where, what model, how much, which reward."""
    from omegaconf import OmegaConf

    from stapo.verl_plugin.preflight.cluster_shape import shape_line

    def get(key: str, default=None):
        return OmegaConf.select(config, key, default=default)

    device = get("trainer.device")
    steps = get("trainer.total_training_steps")
    epochs = get("trainer.total_epochs")
    rollout = get("actor_rollout_ref.rollout")
    reward = get("reward.custom_reward_function.path")
    if get("reward.reward_model.enable", False):
        reward_text = f"reward model {get('reward.reward_model.model_path')}"
    elif reward:
        reward_text = f"{reward} ({get('reward.custom_reward_function.name') or 'compute_score'})"
    else:
        reward_text = "verl's default_compute_score, by data_source"
    batch = (f"batch: {get('data.train_batch_size')} prompts x {rollout.n} samples, responses up to "
             f"{get('data.max_response_length')} tokens")
    return [
        f"preset: model_preset={choices.get('model_preset')}, algo={choices.get('algo')}",
        *rule_lines(config, choices.get("algo")),
        f"device: {device}, {shape_line(config)}",
        f"model: {get('actor_rollout_ref.model.path')}",
        batch,
        (f"steps: {steps}" if steps is not None else f"steps: trainer.total_epochs={epochs} pass(es) over the data")
        + validation_text(get("trainer.test_freq", -1), get("trainer.val_before_train", True)),
        f"rollout: {rollout.name} ({rollout.mode}, tensor parallel {rollout.tensor_model_parallel_size})",
        f"reward: {reward_text}",
        seed_line(get("data.seed"), get("actor_rollout_ref.rollout.seed")),
    ]


def rule_lines(config, algo: str | None) -> list[str]:
    """``token rule: custom:NAME from FILE`` when the user's rule replaces the preset's (else nothing: the preset
    line says it): ``algo=`` alone would name a rule the run does not train with."""
    from omegaconf import OmegaConf

    section = OmegaConf.select(config, "stapo.custom_rule", default=None) or {}
    name = section.get("name", None)
    if not name:
        return []
    return [f"token rule: custom:{name} from {section.get('path', None)} (replaces algo={algo}'s rule)"]


def seed_line(data_seed, rollout_seed) -> str:
    """The run's seeds, and whether a sweep's run of that seed is its pair: a sweep's seed S sets both
    ``data.seed`` and ``actor_rollout_ref.rollout.seed`` to S (stapo.sweep.grid.SEED_KEYS)."""
    if data_seed == rollout_seed:
        return f"seed: {data_seed} (data order and rollouts; a sweep's --seeds {data_seed} run is this run's pair)"
    return (f"seed: data.seed={data_seed}, actor_rollout_ref.rollout.seed={rollout_seed}: a sweep's seed S sets both "
            f"to S, so no sweep run pairs with this one (set both alike to pair)")


def resolved_yaml(config) -> str:
    """The config as verl will see it (``${oc.env:...}`` and ``${hydra:...}`` resolved)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        return OmegaConf.to_yaml(config, resolve=True)
    except OmegaConfBaseException as error:
        raise STAPOConfigError(f"cannot resolve the config: {str(error).splitlines()[0]}") from None



def validation_text(test_freq, before: bool) -> str:
    """``, validated every 10 steps and before training`` (what the steps' time leaves out)."""
    parts = [f"every {test_freq} steps and at the last"] if test_freq and test_freq > 0 else []
    parts += ["before training"] if before else []
    return f", validated {' and '.join(parts)}" if parts else ", no validation"
