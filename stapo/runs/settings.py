"""What the compared groups differ in, read from each run's ``config.yaml``: the comparison's own account of
what was compared.

A sweep's cells differ in their grid's overrides and nothing else; runs gathered from several sets (``stapo
compare``: an ablation's cells beside another set's runs of the centre) may differ in more than the reader
assumes, a step count, a test frequency, a setting the code's version added. So every setting of the runs'
resolved configs is flattened to ``dotted.key -> value`` and each group is set beside the baseline group: the keys
whose value differs, with both values. Keys that differ between two runs *of one group* make a warning: a group
should be one setting run with several seeds.

Left out, because they are meant to differ from run to run: the seeds (pairing is by seed), the run's own
folders and names (``RUN_SPECIFIC``) and every setting whose value holds that folder or name (log directories).
Pure Python over the parsed configs (omegaconf only to read them).
"""

from __future__ import annotations

from pathlib import Path

# the settings a sweep gives every run of its own (stapo.sweep.grid.PlannedRun.overrides): not a difference
RUN_SPECIFIC = (
    "data.seed", "actor_rollout_ref.rollout.seed", "stapo.run_dir", "trainer.default_local_dir",
    "trainer.resume_mode", "trainer.experiment_name",
)
MIXED = "(differs between its runs)"
ABSENT = "(absent)"


def flat_settings(node, prefix: str = "") -> dict[str, object]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; lists are values (compared whole)."""
    if not isinstance(node, dict):
        return {prefix: node}
    flat: dict[str, object] = {}
    for name, value in node.items():
        flat.update(flat_settings(value, f"{prefix}.{name}" if prefix else str(name)))
    return flat


def read_settings(run_dir: Path) -> dict[str, object] | None:
    """The run's config.yaml flattened, without the run-specific keys; None when the folder has none."""
    from omegaconf import OmegaConf

    from stapo.runs.folder import load_run_config

    config = load_run_config(Path(run_dir))
    if config is None:
        return None
    flat = flat_settings(OmegaConf.to_container(config, resolve=False))
    # a setting derived from the run's own folder or name (a log directory, a trace name) differs by design too
    own = [str(flat[key]) for key in ("stapo.run_dir", "trainer.experiment_name") if flat.get(key)]
    return {key: value for key, value in flat.items()
            if key not in RUN_SPECIFIC and not any(name in str(value) for name in own)}


def group_settings(configs: list[dict[str, object]]) -> tuple[dict[str, object], list[str]]:
    """One group's settings: each key's value where all its runs agree, ``MIXED`` where they do not (a key one
    run lacks counts as ``ABSENT`` for it); and the mixed keys, sorted."""
    keys = sorted({key for config in configs for key in config})
    merged, mixed = {}, []
    for key in keys:
        values = [config.get(key, ABSENT) for config in configs]
        if all(value == values[0] for value in values):
            merged[key] = values[0]
        else:
            merged[key] = MIXED
            mixed.append(key)
    return merged, mixed


def differences(groups: dict[str, list[dict[str, object]]], baseline: str) -> dict[str, dict]:
    """For each group but the baseline: ``{key: [baseline's value, group's value]}`` where they differ; for every
    group: the keys its runs disagree on. Groups whose runs have no config are left out.

    Returns ``{"against": baseline, "differ": {group: {key: [b, g]}}, "mixed": {group: [keys]}}``."""
    merged = {}
    mixed = {}
    for name, configs in groups.items():
        if configs:
            merged[name], keys = group_settings(configs)
            if keys:
                mixed[name] = keys
    base = merged.get(baseline)
    differ = {}
    if base is not None:
        for name, settings in merged.items():
            if name == baseline:
                continue
            keys = sorted(set(base) | set(settings))
            differ[name] = {key: [base.get(key, ABSENT), settings.get(key, ABSENT)] for key in keys
                            if base.get(key, ABSENT) != settings.get(key, ABSENT)}
    return {"against": baseline, "differ": differ, "mixed": mixed}


def settings_markdown(found: dict, groups: int) -> str:
    """The table comparison.md carries: one row per (group, differing key); nothing for a comparison of one group."""
    if groups < 2:
        return ""
    lines = [f"\n## Settings that differ from {found['against']} (config.yaml; seeds and run folders left out)\n"]
    if not found["differ"]:
        lines.append("\nThe baseline or every other group has no config.yaml: nothing to set side by side.\n")
        return "".join(lines)
    lines.append(f"\n| group | setting | {found['against']} | group |\n|---|---|---|---|\n")
    for name, keys in found["differ"].items():
        if not keys:
            lines.append(f"| {name} | (none) | | |\n")
        for key, (base, value) in keys.items():
            lines.append(f"| {name} | `{key}` | {_cell(base)} | {_cell(value)} |\n")
    return "".join(lines)


def mixed_warning(found: dict) -> str | None:
    """A warning naming the groups whose runs were made with different settings (at most five keys each)."""
    if not found["mixed"]:
        return None
    parts = [f"{name} ({', '.join(keys[:5])}{', ...' if len(keys) > 5 else ''})"
             for name, keys in found["mixed"].items()]
    return ("runs of one group differ in settings besides their seed: " + "; ".join(parts)
            + ": a group's spread then mixes two settings")


def _cell(value) -> str:
    text = str(value).replace("|", "\\|")
    return (text[:60] + "...") if len(text) > 63 else text


TOKEN_MASK_KEY = "actor_rollout_ref.actor.policy_loss.token_mask"
RULE_PATH_KEY = "stapo.custom_rule.path"


def token_rules(groups: dict[str, list[dict[str, object]]]) -> dict[str, str]:
    """Each group's token rule as its runs' config.yaml names it, a custom one with its file (``custom:NAME from
    FILE``): the table's cell name alone need not say that a user's rule replaced the preset's. Empty unless some
    group trains with a custom rule."""
    rules = {}
    for name, configs in groups.items():
        if not configs:
            continue
        merged, _ = group_settings([{key: config.get(key, ABSENT) for key in (TOKEN_MASK_KEY, RULE_PATH_KEY)}
                                    for config in configs])
        rule = str(merged[TOKEN_MASK_KEY])
        rules[name] = f"{rule} from {merged[RULE_PATH_KEY]}" if rule.startswith("custom:") else rule
    return rules if any(rule.startswith("custom:") for rule in rules.values()) else {}


def token_rules_markdown(rules: dict[str, str]) -> str:
    """One line naming each group's token rule, when one of them is a user's."""
    if not rules:
        return ""
    return ("\nToken rule of each group (`policy_loss.token_mask`): "
            + "; ".join(f"{name}: `{_cell(rule)}`" for name, rule in rules.items()) + "\n\n")
