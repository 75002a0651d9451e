"""A user's files loaded in every process of a run: a token rule (``stapo.custom_rule``) and loss files
(``stapo.import_files``).

docs/algorithm.md section 10. verl's registries (policy losses) and this project's (token rules) live in each
process's memory: a file the driver imported is unknown to a Ray worker. So the driver (``apply_to_run``, from
``recipe.stapo.main_stapo.prepare``) writes what to load into ``ray_kwargs.ray_init.runtime_env.env_vars``,
the job's environment on every node (the way the CPU back-end's flag travels, ``stapo.verl_plugin.cpu``), and
every process loads it when the registry it fills is imported (``load_on_import``, called by the plugin's
``register_all`` at ``import verl``): the rule when ``stapo.algorithm.masks`` is, the loss files when verl's
``core_algos`` is. A path must therefore be readable on every node: absolute on shared storage, or relative to
the job's working directory (``launch/ray/submit.sh`` uploads the repository as such: every node's workers run
in their copy of it); a process that cannot find a relative path under its own working directory takes the
driver's absolute one (a local run). The rule is registered as ``custom:NAME`` and the run's
``policy_loss.token_mask`` names it, replacing the preset's rule; the run folder's config.yaml says so.

What every process runs is what the driver checked: the driver records the sha256 of the bytes it executed
(``LOADED``) and hands it over with the path; a process whose copy of the file differs (edited after the check,
another node's stale copy) refuses to load it, naming the file, before its first update. A weight rule's weights
above ``stapo.custom_rule.max_weight`` are refused (a weight multiplies a token's loss: 1e6 is a slip, not a
setting).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from stapo.algorithm.validation import STAPOConfigError

RULE_ENV = "STAPO_CUSTOM_RULE"  # JSON: {"path", "name", "kind", "kwargs", "fallback", "sha256", "max_weight"}
IMPORTS_ENV = "STAPO_IMPORT_FILES"  # JSON: a list of [path as given, the driver's absolute path, sha256]
ENV_VARS = "ray_kwargs.ray_init.runtime_env.env_vars"
RULE_KEY = "stapo.custom_rule"
IMPORTS_KEY = "stapo.import_files"
TOKEN_MASK_KEY = "actor_rollout_ref.actor.policy_loss.token_mask"
MASKS_MODULE = "stapo.algorithm.masks"
LOSS_REGISTRY_MODULE = "verl.trainer.ppo.core_algos"
MODULE_PREFIX = "stapo_user_files."
# a weight multiplies its token's loss in a mean over the batch's tokens: the built-in weights stay within [0, 1.1]
# (STARE's W); at 10 one token already carries the gradient of ten, beyond which a weight is more likely a slip (a
# missing normalisation, a 1e6) than a choice. A setting: a rule that means it raises the bound
DEFAULT_MAX_WEIGHT = 10.0
# the sha256 of the bytes this process executed, by absolute path: what the driver hands over and a worker compares
LOADED: dict[str, str] = {}


@dataclass(frozen=True)
class RuleSetting:
    """``stapo.custom_rule``: the file, the function's name, the keywords it is also given; ``kind`` once checked."""

    path: str
    name: str
    kwargs: dict = field(default_factory=dict)
    kind: str | None = None
    fallback: str | None = None  # the driver's absolute path of a relative ``path``
    sha256: str | None = None  # of the file the driver checked; None: not checked yet (the driver itself)
    max_weight: float = DEFAULT_MAX_WEIGHT

    @property
    def registry_name(self) -> str:
        from stapo.algorithm.custom_rule import registry_name

        return registry_name(self.name)

    def to_env(self) -> str:
        return json.dumps({"path": self.path, "name": self.name, "kind": self.kind, "kwargs": self.kwargs,
                           "fallback": self.fallback, "sha256": self.sha256, "max_weight": self.max_weight})

    @classmethod
    def from_env(cls, text: str) -> RuleSetting:
        value = json.loads(text)
        return cls(value["path"], value["name"], dict(value.get("kwargs") or {}), value.get("kind"),
                   value.get("fallback"), value.get("sha256"), float(value.get("max_weight", DEFAULT_MAX_WEIGHT)))

    def located(self) -> str:
        return locate(self.path, self.fallback)


def rule_setting(config) -> RuleSetting | None:
    """The configured rule: None while ``stapo.custom_rule.name`` is null (the preset's rule; the name is the
    switch, so a sweep can compare ``name=null,my_rule`` with one path); a name without a path is refused."""
    from omegaconf import OmegaConf

    section = OmegaConf.select(config, RULE_KEY, default=None) or {}
    path, name = section.get("path", None), section.get("name", None)
    if name is None:
        return None
    if not path:
        raise STAPOConfigError(
            f"{RULE_KEY}.name={name} needs {RULE_KEY}.path, the absolute path of the file that defines it"
        )
    if not isinstance(name, str) or not name.isidentifier():
        raise STAPOConfigError(f"{RULE_KEY}.name must be a Python function name, got {name!r}")
    kwargs = section.get("kwargs", None) or {}
    if not hasattr(kwargs, "items"):
        raise STAPOConfigError(f"{RULE_KEY}.kwargs must be a mapping of keyword to value, got {kwargs!r}")
    kwargs = OmegaConf.to_container(kwargs, resolve=True) if OmegaConf.is_config(kwargs) else dict(kwargs)
    from stapo.algorithm.custom_rule import HELPER_NAME, TENSOR_NAMES

    taken = sorted(set(kwargs) & {*TENSOR_NAMES, HELPER_NAME})
    if taken:
        raise STAPOConfigError(f"{RULE_KEY}.kwargs may not name what the rule is given already: {taken}")
    path = os.path.expanduser(str(path))
    return RuleSetting(path, name, kwargs, None, _drivers_absolute(path), None, max_weight(section))


def max_weight(section) -> float:
    """``stapo.custom_rule.max_weight``: a number > 0 (``.inf`` lifts the bound), by default ``DEFAULT_MAX_WEIGHT``."""
    value = section.get("max_weight", None)
    if value is None:
        return DEFAULT_MAX_WEIGHT
    try:
        bound = float(value)
    except (TypeError, ValueError):
        bound = math.nan
    if isinstance(value, bool) or not bound > 0:
        raise STAPOConfigError(f"{RULE_KEY}.max_weight must be a number > 0 (.inf: no bound), got {value!r}")
    return bound


def import_files(config) -> list[tuple[str, str]]:
    """``stapo.import_files``: Python files to import in every process (e.g. a loss that registers itself with
    verl's ``register_policy_loss``), each as (the path as given, its absolute path here)."""
    from omegaconf import OmegaConf

    files = OmegaConf.select(config, IMPORTS_KEY, default=None) or []
    if isinstance(files, str) or not hasattr(files, "__iter__"):
        raise STAPOConfigError(f"{IMPORTS_KEY} must be a list of paths of .py files, got {files!r}")
    paths = [os.path.expanduser(str(path)) for path in files]
    return [(path, _drivers_absolute(path)) for path in paths]


def _drivers_absolute(path: str) -> str:
    """The absolute path the driver resolved ``path`` to, in a process the driver started with it in the job's
    environment (the TaskRunner, which checks the config again, need not run in the driver's directory); else
    this process's own resolution (this process is the driver)."""
    known = {}
    if os.environ.get(RULE_ENV):
        setting = RuleSetting.from_env(os.environ[RULE_ENV])
        known[setting.path] = setting.fallback
    if os.environ.get(IMPORTS_ENV):
        known.update({entry[0]: entry[1] for entry in json.loads(os.environ[IMPORTS_ENV])})
    return known.get(path) or os.path.abspath(path)


def locate(path: str, fallback: str | None = None) -> str:
    """Where this process reads ``path``: itself when absolute; relative to this process's working directory
    when the file is there (a Ray job's uploaded working directory, on every node); else the driver's absolute
    path (a local run's workers need not start in the driver's directory)."""
    if os.path.isabs(path) or os.path.isfile(path) or not fallback:
        return os.path.abspath(path)
    return fallback


def load_file(path: str, key: str, fallback: str | None = None, sha256: str | None = None) -> ModuleType:
    """The module of ``path`` (``locate``), imported once per process (a second call returns it). A missing file,
    a syntax error or an error at import (``sys.exit`` included) is refused in one line: the file, the line and the
    reason. The bytes hashed are the bytes executed (``LOADED``); with ``sha256`` (what the driver checked, by
    default read from the job's environment) a file that differs is refused before anything of it runs."""
    sha256 = sha256 or _digest_from_env(path, key)
    path = locate(path, fallback)
    module_name = MODULE_PREFIX + Path(path).stem.replace("-", "_") + "_" + hashlib.sha1(path.encode()).hexdigest()[:8]
    if module_name in sys.modules:
        refuse_changed(key, path, LOADED.get(path), sha256)
        return sys.modules[module_name]
    if not os.path.isfile(path):
        raise STAPOConfigError(f"{key}={path}: no such file")
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise STAPOConfigError(f"{key}={path}: not a Python file Python can import")
    source = Path(path).read_bytes()
    digest = hashlib.sha256(source).hexdigest()  # as stapo.files.sha256_file, of the bytes compiled below
    refuse_changed(key, path, digest, sha256)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        exec(compile(source, path, "exec"), module.__dict__)  # noqa: S102 - the user's file, as an import runs it
    except KeyboardInterrupt:  # the user stopping the command, not the file's fault
        del sys.modules[module_name]
        raise
    except BaseException as error:  # the user's code (an exit too): its own error, located in its own file
        del sys.modules[module_name]
        raise STAPOConfigError(f"{error_location(error, path)}: cannot import: {describe_error(error)}") from None
    LOADED[path] = digest
    return module


def _digest_from_env(given: str, key: str) -> str | None:
    """The digest the driver handed over for the file given as ``given`` (a TaskRunner checks the config again)."""
    if key == f"{RULE_KEY}.path" and os.environ.get(RULE_ENV):
        setting = RuleSetting.from_env(os.environ[RULE_ENV])
        return setting.sha256 if setting.path == given else None
    if key == IMPORTS_KEY and os.environ.get(IMPORTS_ENV):
        return next((entry[2] for entry in json.loads(os.environ[IMPORTS_ENV]) if entry[0] == given and len(entry) > 2),
                    None)
    return None


def refuse_changed(key: str, path: str, digest: str | None, expected: str | None) -> None:
    """One line when the file's digest is not the one the driver checked (nothing to compare: no refusal)."""
    if expected is None or digest is None or digest == expected:
        return
    raise STAPOConfigError(
        f"{key}={path}: the file changed after the driver checked it (sha256 {expected[:12]} checked, {digest[:12]} "
        "here): this process refuses to run code the check never saw; start the run again to check the new file"
    )


def file_digest(path: str) -> str:
    """The sha256 of what this process executed from ``path`` (its absolute path), else of the file now."""
    from stapo.files import sha256_file

    return LOADED.get(path) or sha256_file(Path(path))


def error_location(error: BaseException, path: str) -> str:
    """``file:line`` of ``error`` in ``path`` (the innermost frame there), or the file alone."""
    if isinstance(error, SyntaxError) and error.filename and os.path.samefile(error.filename, path):
        return f"{path}:{error.lineno}"
    from stapo.algorithm.custom_rule import raising_line

    line = raising_line(error, path)
    return f"{path}:{line}" if line else path


def describe_error(error: BaseException) -> str:
    if isinstance(error, SystemExit):  # str() of an exit is its bare code
        return f"SystemExit({error.code!r}): it calls sys.exit; a file the run loads must return or raise, not exit"
    text = str(error).splitlines()[0] if str(error) else ""
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def find_function(module: ModuleType, setting: RuleSetting):
    """The rule function the setting names, or a one-line refusal listing the file's functions."""
    fn = getattr(module, setting.name, None)
    if fn is None or not callable(fn):
        defined = sorted(name for name, value in vars(module).items()
                         if callable(value) and not name.startswith("_") and getattr(value, "__module__", None)
                         == module.__name__)
        raise STAPOConfigError(
            f"{setting.located()}: no function {setting.name!r} ({RULE_KEY}.name); the file defines {defined}"
        )
    return fn


def function_line(fn, path: str) -> str:
    code = getattr(fn, "__code__", None)
    return f"{path}:{code.co_firstlineno}" if code is not None else path


def register_rule(setting: RuleSetting, fn=None) -> str:
    """Load the rule (unless ``fn`` is given) and register it as ``custom:NAME`` with the setting's kind."""
    from stapo.algorithm.custom_rule import CustomRule

    if fn is None:
        fn = find_function(load_file(setting.path, f"{RULE_KEY}.path", setting.fallback, setting.sha256), setting)
    where = f"{function_line(fn, setting.located())} ({setting.name})"
    return CustomRule(fn, setting.registry_name, setting.kind, dict(setting.kwargs), where,
                      setting.max_weight).register()


# --- every process: load what the driver wrote into the job's environment ------------------------------------


def load_on_import() -> None:
    """Called by ``stapo.verl_plugin.registration.register_all`` (``import verl``, in every process): the rule
    once ``stapo.algorithm.masks`` is imported there, the loss files once verl's ``core_algos`` is."""
    from stapo.verl_plugin.import_hooks import after_import

    if os.environ.get(RULE_ENV):
        after_import(MASKS_MODULE, _register_rule_from_env)
    if os.environ.get(IMPORTS_ENV):
        after_import(LOSS_REGISTRY_MODULE, _import_files_from_env)


def _register_rule_from_env(_masks) -> None:
    setting = RuleSetting.from_env(os.environ[RULE_ENV])
    register_rule(setting)


def _import_files_from_env(_core_algos) -> None:
    for path, fallback, *digest in json.loads(os.environ[IMPORTS_ENV]):
        load_file(path, IMPORTS_KEY, fallback, digest[0] if digest else None)


# --- the driver: hand the files to every process of the run -------------------------------------------------


def apply_to_run(config, kind: str | None) -> list[str]:
    """Driver side, after the checks (``kind``: what the checked rule returns): the rule replaces the preset's
    (``policy_loss.token_mask=custom:NAME``), and the job's environment tells every process what to load and the
    sha256 of what the check ran (each process compares it before it runs the file).
    Returns what was set, for the log. A value the user gave that says otherwise is refused, never overwritten."""
    from omegaconf import OmegaConf, open_dict

    setting, files = rule_setting(config), import_files(config)
    done = []
    env_vars = OmegaConf.select(config, ENV_VARS, default=None) or {}
    values = {}
    if setting is not None:
        values[RULE_ENV] = RuleSetting(setting.path, setting.name, setting.kwargs, kind, setting.fallback,
                                       file_digest(setting.located()), setting.max_weight).to_env()
    if files:
        values[IMPORTS_ENV] = json.dumps([[given, fallback, file_digest(locate(given, fallback))]
                                          for given, fallback in files])
    for name, value in values.items():
        given = env_vars.get(name, None)
        if given is not None and given != value:
            raise STAPOConfigError(
                f"{ENV_VARS}.{name} is set by the recipe from {RULE_KEY} and {IMPORTS_KEY}: leave it out "
                f"(got {given!r})"
            )
        OmegaConf.update(config, f"{ENV_VARS}.{name}", value, force_add=True)
        os.environ[name] = value  # this process, and a local Ray's workers, whatever Ray does with the env
        done.append(f"{ENV_VARS}.{name}")
    if setting is not None:
        with open_dict(config):
            OmegaConf.update(config, TOKEN_MASK_KEY, setting.registry_name, force_add=True)
        done.append(f"{TOKEN_MASK_KEY}={setting.registry_name}")
    return done
