"""Session-wide test set-up.

The launch scripts, the `stapo` CLI and Ray's own worker start-up call `ray`, `stapo` and `python`
by name, as they do for a user who activated the environment. CI runs `.venv/bin/python -m pytest`
without activating anything, so the interpreter's own bin directory goes first on PATH here, for
the tests and every process they start.
"""

import os
import sys
from pathlib import Path

_BIN = str(Path(sys.executable).parent)
if os.environ.get("PATH", "").split(os.pathsep)[0] != _BIN:
    os.environ["PATH"] = _BIN + os.pathsep + os.environ.get("PATH", "")
