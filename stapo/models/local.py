"""``stapo://NAME`` model paths: checkpoints this project builds or converts locally, no hub access.

The recipe calls :func:`resolve_model_path` on ``actor_rollout_ref.model.path`` before verl sees
it; any other path (a hub id, a folder) is verl's business and passes through unchanged.
"""

from __future__ import annotations

import importlib

SCHEME = "stapo://"
# name: (module, function returning the checkpoint folder); imported only when asked for
LOCAL_MODELS = {
    "tiny": ("stapo.models.tiny", "build_tiny_model"),
    "smollm2": ("stapo.models.smollm2", "smollm2_path"),
    "testbed": ("stapo.models.testbed", "build_testbed_model"),
    "tailbed": ("stapo.models.tailbed", "build_tailbed_model"),
}


def resolve_model_path(path: str) -> str:
    """The folder of a ``stapo://`` model (built once and cached), or ``path`` itself."""
    if not path.startswith(SCHEME):
        return path
    name = path[len(SCHEME) :]
    if name not in LOCAL_MODELS:
        known = ", ".join(SCHEME + known for known in LOCAL_MODELS)
        raise ValueError(f"actor_rollout_ref.model.path={path!r}: known local models are {known}")
    module, function = LOCAL_MODELS[name]
    return getattr(importlib.import_module(module), function)()
