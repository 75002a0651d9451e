"""stapo/verl_plugin/'s folders say which code a GPU run executes, and this keeps the map true.

The map is the package docstring's (stapo/verl_plugin/__init__.py): the loading modules at the top, ``training/``,
``preflight/`` and ``reproducible/`` on every run, ``opt_in/`` only when a setting turns it on, ``cpu/`` only on the
CPU back-end, ``export/`` for ``stapo export``. Checked here, from the source and the preset files:
- every module of the package lies in one of those folders (a new file has to choose one);
- the modules outside ``cpu/`` that import from it are exactly ``CPU_NAMES_ON_EVERY_RUN``, each with what it takes
  and why a GPU run is unaffected (a name, or a gate that returns at once): a new import of ``cpu/`` from the
  GPU path fails here until it is listed with its reason;
- the GPU presets turn on no ``opt_in/`` setting, and the recipe's defaults leave each off.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import yaml

from stapo.preset_fit import gpu_presets
from tests.unit.test_import_graph import import_graph

REPO = Path(__file__).resolve().parents[2]
PLUGIN = REPO / "stapo" / "verl_plugin"
TOP_LEVEL = {"__init__", "entry", "import_hooks", "registration"}
FOLDERS = {"training", "preflight", "reproducible", "opt_in", "cpu", "export"}

# (importing module, cpu/ module) -> what it takes, and why a GPU run is unaffected
CPU_NAMES_ON_EVERY_RUN = {
    ("stapo.verl_plugin.registration", "stapo.verl_plugin.cpu"):
        "activate_if_requested / hide_unused_vllm: return at once unless STAPO_CPU_BACKEND=1 / STAPO_HIDE_VLLM=1",
    ("stapo.verl_plugin.training.trainer", "stapo.verl_plugin.cpu.rollout"):
        "announce_submissions: returns False unless the rollout is the CPU back-end's HF server",
    ("stapo.verl_plugin.training.driver_diagnostics", "stapo.verl_plugin.cpu.sampling"):
        "TOKEN_STATS_FIELD: the name of a field only the HF server writes",
    ("stapo.verl_plugin.reproducible.seeded_agent_loop", "stapo.verl_plugin.cpu.rollout"):
        "GROUP_PARAM, ROLLOUT_NAME: names; the group parameter is sent only to the HF server",
    ("stapo.verl_plugin.preflight.run_checks", "stapo.verl_plugin.cpu.vllm_cpu"):
        "the checks of vLLM's CPU build: each returns None unless trainer.device=cpu with rollout.name=vllm",
    ("stapo.verl_plugin.preflight.run_checks", "stapo.verl_plugin.cpu.rollout"):
        "BATCH_CHOICES: the allowed values of stapo.hf_rollout_batch, checked on every run",
}
OPT_IN_MODULES = ("one_server", "local_reward", "group_puts")


def test_every_module_lies_in_a_folder_of_the_map():
    modules = {path.relative_to(PLUGIN) for path in PLUGIN.rglob("*.py")}
    top = {path.stem for path in modules if len(path.parts) == 1}
    folders = {path.parts[0] for path in modules if len(path.parts) > 1}
    assert top == TOP_LEVEL, f"a module at the top of stapo/verl_plugin/ outside the map: {sorted(top - TOP_LEVEL)}"
    assert folders == FOLDERS, f"folders not in the map: {sorted(folders ^ FOLDERS)}"
    for folder in FOLDERS:
        assert (PLUGIN / folder / "__init__.py").is_file()
        assert f"``{folder}/``" in (PLUGIN / "__init__.py").read_text(encoding="utf-8"), f"{folder}/ not described"


def test_the_gpu_path_imports_from_cpu_only_what_is_listed():
    graph = import_graph(REPO / "stapo")
    found = {(module, target) for module, targets in graph.items() for target in targets
             if target.startswith("stapo.verl_plugin.cpu") and not module.startswith("stapo.verl_plugin.cpu")}
    listed = set(CPU_NAMES_ON_EVERY_RUN)
    assert found == listed, f"unlisted: {sorted(found - listed)}; stale: {sorted(listed - found)}"


def test_the_gpu_presets_turn_on_nothing_of_opt_in():
    settings = [importlib.import_module(f"stapo.verl_plugin.opt_in.{name}").SETTING for name in OPT_IN_MODULES]
    defaults = yaml.safe_load((REPO / "conf" / "stapo_trainer.yaml").read_text(encoding="utf-8"))
    # the presets without a cpu_preset record (stapo.preset_fit's reading) and the paper's shared file
    folder = REPO / "conf" / "model_preset"
    gpu = [folder / f"{name}.yaml" for name in [*gpu_presets(), "_qwen3_paper"]]
    assert {path.stem for path in gpu} >= {"_qwen3_paper", "qwen3_0p6b_smoke", "qwen3_1p7b", "qwen3_8b", "qwen3_14b"}
    for setting in settings:
        section, key = setting.split(".")
        assert defaults[section][key] is False, f"{setting} is on by default"
        for path in gpu:
            preset = yaml.safe_load(path.read_text(encoding="utf-8"))
            assert (preset.get(section) or {}).get(key) in (None, False), f"{path.name} turns on {setting}"
