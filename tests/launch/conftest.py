"""One loopback Ray cluster and one tiny two-node job for every launch test.

``cluster``: a real two-node Ray cluster on this machine (launch/ray/start_head.sh and
start_worker.sh, one logical GPU slot each), started once for the package tests/launch and
stopped after its last test; the teardown checks that no process of it is left (only the
processes the scripts started are signalled, nothing calls `ray stop`: other people run Ray on the
same machine). Used by tests/launch/test_cluster.py and tests/launch/test_smoke_cluster.py, which
each started their own cluster before.

``two_node_job``: the tiny STAPO job on two nodes (trainer.nnodes=2 trainer.n_gpus_per_node=1, 2 steps,
checkpoint at step 2 on the shared directory) on verl's vLLM rollout (vLLM's CPU build, one replica a
node, as a GPU job runs), with the paper-literal detection (``policy_loss.source=current``: the entropy of
the update's own forward, tau_h over both DP ranks, one on each node), submitted once through
`stapo doctor --smoke`, which
submits it with launch/ray/submit.sh and waits for it. Both test_cluster.py (the submit.sh job and its
checkpoint) and test_smoke_cluster.py (the smoke report) read it; each submitted the same job before.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from stapo.runs.progress import parse_steps
from tests.launch.local_cluster import smoke, start_cluster

# detection inside the update (the paper's literal reading) rather than from the old pass
SOURCE_CURRENT = (
    "actor_rollout_ref.actor.policy_loss.source=current",
    "actor_rollout_ref.actor.calculate_entropy=true",
)


@pytest.fixture(scope="package")
def cluster(tmp_path_factory):
    # Ray's socket paths are limited to 107 bytes: a folder under pytest's basetemp is too long once the
    # basetemp is (a worker's popen-gwN/, a --basetemp in a deep workspace), so the nodes live in /tmp
    root = Path(tempfile.mkdtemp(prefix="r", dir="/tmp"))
    shared = tmp_path_factory.mktemp("shared")
    started = time.monotonic()
    cluster = start_cluster(root, shared, num_cpus=8, num_gpus=1)
    print(f"[launch] two-node cluster up in {time.monotonic() - started:.1f} s at {cluster.gcs_address}")
    cluster.shared = shared
    yield cluster
    # the cluster stops without leftovers (an error at this teardown names the processes left)
    started = time.monotonic()
    cluster.stop()
    print(f"[launch] cluster stopped in {time.monotonic() - started:.1f} s")
    assert cluster.own_processes() == []
    assert all(node.proc.poll() is not None for node in cluster.nodes)
    shutil.rmtree(root, ignore_errors=True)


@dataclass
class TwoNodeJob:
    result: subprocess.CompletedProcess  # stapo doctor --smoke's own output (the JSON report on stdout)
    report: dict | None  # the smoke check's result, None when stdout held no report
    job_id: str | None
    log: str  # the whole output of submit.sh (its messages, then the job's log), as doctor --smoke saved it
    ckpt: Path
    seconds: float

    @property
    def steps(self) -> dict[int, dict[str, float]]:
        """The metrics of each step the job's console logged."""
        return parse_steps(self.log)


@pytest.fixture(scope="package")
def two_node_job(cluster) -> TwoNodeJob:
    ckpt = cluster.shared / "job-ckpt"
    started = time.monotonic()
    result = smoke(cluster, "algo=stapo", "trainer.save_freq=2", f"trainer.default_local_dir={ckpt}",
                   "actor_rollout_ref.rollout.name=vllm", *SOURCE_CURRENT)
    seconds = time.monotonic() - started
    report, job_id, log = None, None, ""
    try:
        report = json.loads(result.stdout)["results"][0]
    except (ValueError, LookupError):
        pass
    if report and report.get("details"):
        # "job <id>; full log: <path>"
        head, _, path = report["details"][0].partition("; full log: ")
        job_id = head.removeprefix("job ")
        if Path(path).is_file():
            log = Path(path).read_text(errors="replace")
    print(f"[launch] tiny STAPO job on vLLM, source=current, 2 nodes x 1 slot, 2 steps, submitted with submit.sh: "
          f"{seconds:.0f} s")
    return TwoNodeJob(result, report, job_id, log, ckpt, seconds)
