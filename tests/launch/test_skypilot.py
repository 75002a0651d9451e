"""launch/skypilot/stapo.yaml, checked without SkyPilot: its shape, the scripts it runs, the image it
names, and every environment variable its scripts read is set by the task, by SkyPilot or documented.

SkyPilot itself (and a cloud) cannot run here; run.sh's own refusals run for real.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.launch.test_static import _dockerfile_args, _tool

REPO = Path(__file__).resolve().parents[2]
TASK = REPO / "launch" / "skypilot" / "stapo.yaml"
# what SkyPilot sets on every node of a task (its documented environment)
SKYPILOT_VARS = {"SKYPILOT_NODE_RANK", "SKYPILOT_NODE_IPS", "SKYPILOT_NUM_NODES", "SKYPILOT_NUM_GPUS_PER_NODE",
                 "SKYPILOT_TASK_ID"}
# set by the shell or the scripts themselves
SHELL_VARS = {"HOME", "PATH", "BASH_SOURCE"}
_VAR = re.compile(r"\$\{?!?([A-Z][A-Z0-9_]*)")


def _task() -> dict:
    return yaml.safe_load(TASK.read_text())


def _scripts(command: str) -> list[Path]:
    return [REPO / match for match in re.findall(r"(launch/\S+\.sh)", command)]


def test_task_has_the_keys_of_a_multi_node_docker_job():
    task = _task()
    assert {"name", "num_nodes", "resources", "workdir", "envs", "setup", "run"} <= set(task)
    assert isinstance(task["num_nodes"], int) and task["num_nodes"] >= 2
    name, _, count = task["resources"]["accelerators"].partition(":")
    assert name and int(count) >= 1
    assert task["workdir"] == "."
    # the project's image, tagged as docker/README.md builds it from the Dockerfile's pins
    args = _dockerfile_args()
    tag = f"stapo:{args['STAPO_VERSION']}-verl{args['VERL_VERSION']}-vllm024"
    assert task["resources"]["image_id"] == f"docker:{tag}"
    assert tag in (REPO / "docker" / "README.md").read_text()
    assert task["resources"]["ports"] == int(task["envs"]["RAY_DASHBOARD_PORT"])
    assert all(isinstance(v, str) for v in task["envs"].values()), "SkyPilot env values are strings"
    # the checkpoint folder is the mount every node shares
    assert task["envs"]["STAPO_CHECKPOINT_DIR"] in task["file_mounts"]


def test_every_script_the_task_runs_exists_and_uses_the_ray_scripts():
    task = _task()
    called = _scripts(task["setup"]) + _scripts(task["run"])
    assert called and all(path.is_file() for path in called), called
    run = (REPO / "launch" / "skypilot" / "run.sh").read_text()
    for script in ("start_head.sh", "start_worker.sh", "submit.sh"):
        assert f'"$ray_dir/{script}"' in run, script
    assert (REPO / "launch" / "ray" / "start_head.sh").is_file()
    # the job's shape comes from SkyPilot's own numbers, so it always matches num_nodes x accelerators
    assert '"trainer.nnodes=$SKYPILOT_NUM_NODES" "trainer.n_gpus_per_node=$SKYPILOT_NUM_GPUS_PER_NODE"' in run


@pytest.mark.parametrize("block", ["setup", "run"])
def test_task_commands_pass_shellcheck(block, tmp_path):
    shellcheck = _tool("shellcheck", "apt-get install -y shellcheck")
    script = tmp_path / f"{block}.sh"
    script.write_text("#!/usr/bin/env bash\nset -euo pipefail\n" + _task()[block])
    result = subprocess.run([shellcheck, "--severity=style", str(script)], check=False, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def _variables(text: str) -> set[str]:
    return set(_VAR.findall(text))


def test_every_variable_is_set_by_the_task_or_skypilot_or_documented():
    task = _task()
    provided = set(task["envs"]) | set(task.get("secrets") or {}) | SKYPILOT_VARS | SHELL_VARS
    readme = (REPO / "launch" / "README.md").read_text()
    used = _variables(yaml.safe_dump(task))
    for path in sorted((REPO / "launch" / "skypilot").glob("*.sh")):
        used |= _variables(path.read_text())
    missing = sorted(v for v in used - SHELL_VARS if f"`{v}`" not in readme and v not in provided)
    assert not missing, f"neither set by the task nor documented in launch/README.md: {missing}"
    # and every variable of the task's envs and secrets has a row in the README's SkyPilot table
    undocumented = sorted(v for v in set(task["envs"]) | set(task["secrets"]) if f"`{v}`" not in readme)
    assert not undocumented, undocumented


def _run_sh(env: dict[str, str]) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SKYPILOT_", "RAY_"))}
    base["PATH"] = f"{Path(sys.executable).parent}:{base.get('PATH', '')}"
    return subprocess.run(["bash", "launch/skypilot/run.sh"], check=False, cwd=REPO, env=base | env,
                          capture_output=True, text=True, timeout=60)


def test_run_sh_refuses_outside_skypilot_and_without_a_shared_token():
    outside = _run_sh({})
    assert outside.returncode != 0 and "SKYPILOT_NODE_RANK is not set" in outside.stderr
    node = {"SKYPILOT_NODE_RANK": "1", "SKYPILOT_NODE_IPS": "10.9.9.1\n10.9.9.2", "SKYPILOT_NUM_NODES": "2",
            "SKYPILOT_NUM_GPUS_PER_NODE": "8"}
    tokenless = _run_sh(node)
    assert tokenless.returncode != 0 and "--secret RAY_AUTH_TOKEN" in tokenless.stderr


def test_run_sh_worker_waits_for_the_head_it_is_given(tmp_path):
    # rank 1 joins the first address of SKYPILOT_NODE_IPS; nothing answers there, so it gives up
    node = {"SKYPILOT_NODE_RANK": "1", "SKYPILOT_NODE_IPS": "127.0.0.1\n127.0.0.1", "SKYPILOT_NUM_NODES": "2",
            "SKYPILOT_NUM_GPUS_PER_NODE": "1", "RAY_AUTH_MODE": "disabled", "RAY_HEAD_PORT": "1",
            "RAY_HEAD_WAIT_S": "2", "RAY_TEMP_DIR": str(tmp_path)}
    result = _run_sh(node)
    assert result.returncode != 0
    assert "no Ray head answers at 127.0.0.1:1 after 2s" in result.stderr, result.stderr
