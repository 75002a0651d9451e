"""The GPU image's transformers under the CPU suite: ``make test-image-versions`` (requirements/image-versions.txt).

That target installs the image's transformers into ``.venv-image`` and runs a part of the suite with
``PYTHONPATH=.venv-image`` and ``STAPO_IMAGE_VERSIONS=.venv-image``. Without the variable the overlay test has
nothing to check and skips; the pin test always runs, so the overlay cannot drift from the image it stands for.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[2]
OVERLAY_VAR = "STAPO_IMAGE_VERSIONS"


def image_pins() -> dict[str, str]:
    pins = {}
    for line in (REPO / "requirements" / "image-versions.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            requirement = Requirement(line)
            (spec,) = requirement.specifier
            assert spec.operator == "==", line
            pins[requirement.name] = spec.version
    return pins


def test_overlay_pins_are_the_images():
    dockerfile = (REPO / "docker" / "Dockerfile").read_text()
    image = re.search(r"^ARG TRANSFORMERS_VERSION=(\S+)$", dockerfile, flags=re.MULTILINE).group(1)
    assert image_pins() == {"transformers": image}
    # the CPU suite's own transformers is another one: otherwise the overlay would test nothing new
    assert f"transformers=={image}" not in (REPO / "requirements" / "constraints-cpu.txt").read_text().splitlines()


@pytest.mark.skipif(not os.environ.get(OVERLAY_VAR), reason=f"{OVERLAY_VAR} unset: the image overlay is not active")
def test_the_overlay_is_what_python_imports_here_and_in_child_processes():
    """This process and a child started as the trainer starts its driver (which Ray's workers inherit) import the
    overlay's transformers, not .venv's."""
    import transformers

    overlay = Path(os.environ[OVERLAY_VAR]).resolve()
    expected = image_pins()["transformers"]
    assert transformers.__version__ == expected
    assert Path(transformers.__file__).resolve().is_relative_to(overlay), transformers.__file__
    child = subprocess.run(
        [sys.executable, "-c", "import transformers; print(transformers.__version__, transformers.__file__)"],
        capture_output=True, text=True, check=True, timeout=300,
    ).stdout.split()
    assert child[0] == expected and Path(child[1]).resolve().is_relative_to(overlay), child
