"""Find and mask credentials in configs and text, so nothing a run writes down carries one.

Why: verl prints the whole resolved config (its TaskRunner), hands it to every tracking back-end
(``wandb.init(config=...)``), and the recipe writes it to the run folder (``config.yaml``). A token
therefore leaks the moment it enters the config, typically as
``+ray_kwargs.ray_init.runtime_env.env_vars.HF_TOKEN=${oc.env:HF_TOKEN}`` "to reach the workers".
It never needs to: the workers of a local Ray instance inherit the driver's environment, and those
of a cluster the environment of ``ray start`` on their node. So the driver refuses such a config
(:func:`find_secrets`, called by ``validate_run_config``) instead of trying to scrub every place it
would be copied to; :func:`redact` is for any text or structure that is written anyway.
(Named ``credentials``, not ``secrets``: a module of that name would shadow the standard library's.)
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

# environment variables holding credentials: *_TOKEN, *_KEY, *_SECRET, *_PASSWORD (WANDB_API_KEY, HF_TOKEN, ...)
SECRET_ENV_NAME = re.compile(r"(?i)(^|_)(token|key|secret|password|passwd|credentials?)$")
# config keys holding credentials; stricter than the env rule because verl's config has
# data.prompt_key, data.image_key, ... (names of columns, not secrets)
SECRET_CONFIG_KEY = re.compile(
    r"(?i)(^|_)(token|secret|password|passwd|credentials?|api_key|access_key|secret_key|private_key)$"
)
_ENV_INTERPOLATION = re.compile(r"\$\{oc\.env:\s*([A-Za-z_][A-Za-z0-9_]*)")
_URL_CREDENTIALS = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s:@]+:[^/\s@]+@")
MIN_SECRET_CHARS = 8  # shorter values ("1", "true") are not worth matching and would match everywhere
MASK = "***"


def secret_values(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``{name: value}`` of the credential-like environment variables with a non-trivial value."""
    environ = os.environ if environ is None else environ
    return {
        name: value
        for name, value in environ.items()
        if SECRET_ENV_NAME.search(name) and len(value.strip()) >= MIN_SECRET_CHARS
    }


def _walk(node: Any, path: str):
    if isinstance(node, Mapping):
        for key, value in node.items():
            yield from _walk(value, f"{path}.{key}" if path else str(key))
    elif isinstance(node, (list, tuple)):
        for index, value in enumerate(node):
            yield from _walk(value, f"{path}[{index}]")
    else:
        yield path, node


def find_secrets(container: Any, environ: Mapping[str, str] | None = None) -> list[str]:
    """Where a plain (unresolved) config container holds or pulls in a credential, one line each.

    Flags: a value equal to (or containing) a credential-like environment variable's value; an
    ``${oc.env:NAME}`` of such a variable; a non-empty value under a credential-like key name; a
    URL with ``user:password@``. Values are never echoed, only the key and the variable's name.
    """
    secrets = secret_values(environ)
    found = []
    for path, value in _walk(container, ""):
        if not isinstance(value, str) or not value:
            continue
        leaf = re.split(r"[.\[]", path)[-1]
        names = [name for name, secret in secrets.items() if secret in value]
        names += [name for name in _ENV_INTERPOLATION.findall(value) if SECRET_ENV_NAME.search(name)]
        if names:
            found.append(f"{path} holds the value of ${sorted(set(names))[0]}")
        elif SECRET_CONFIG_KEY.search(leaf):
            found.append(f"{path} looks like a credential (by its name)")
        elif _URL_CREDENTIALS.search(value):
            found.append(f"{path} is a URL with a user:password")
    return found


def redact_text(text: str, environ: Mapping[str, str] | None = None) -> str:
    """``text`` with every credential-like environment value and URL password replaced by ``***``."""
    for secret in sorted(secret_values(environ).values(), key=len, reverse=True):
        text = text.replace(secret, MASK)
    return _URL_CREDENTIALS.sub(lambda match: match.group(1) + MASK + "@", text)


def redact(node: Any, environ: Mapping[str, str] | None = None) -> Any:
    """A copy of a plain dict/list tree with credentials masked (values under credential-like keys too)."""
    if isinstance(node, Mapping):
        return {
            key: MASK if SECRET_CONFIG_KEY.search(str(key)) and isinstance(value, str) and value
            else redact(value, environ)
            for key, value in node.items()
        }
    if isinstance(node, (list, tuple)):
        return [redact(value, environ) for value in node]
    return redact_text(node, environ) if isinstance(node, str) else node

