"""`stapo doctor --smoke` against a real two-node Ray cluster on this machine (launch/ray scripts).

The GPU preset cannot run here, so the smoke path is driven with the tiny CPU preset in its place
(`model_preset=tiny` after `--smoke`): the same submission through submit.sh, the same wait, the same
reading of the job's log. One job passes, one fails on a bad setting and must name it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tests.launch.local_cluster import REPO, start_cluster

pytestmark = [pytest.mark.slow, pytest.mark.e2e]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("ray")
    shared = tmp_path_factory.mktemp("shared")
    cluster = start_cluster(root, shared, num_cpus=8, num_gpus=1)
    cluster.shared = shared
    yield cluster
    cluster.stop()


def _smoke(cluster, *overrides: str) -> subprocess.CompletedProcess:
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "stapo.cli", "doctor", "--smoke", "--json", "--address", cluster.dashboard_url,
         "model_preset=tiny", "trainer.nnodes=2", "trainer.n_gpus_per_node=1", "trainer.total_training_steps=2",
         "trainer.save_freq=-1", *overrides],
        check=False, cwd=REPO, env=cluster.env, capture_output=True, text=True, timeout=900,
    )
    print(f"[smoke] {' '.join(overrides)}: rc={result.returncode} in {time.monotonic() - started:.0f} s")
    return result


@pytest.mark.timeout(1000)
def test_smoke_reports_a_passing_job(cluster):
    result = _smoke(cluster)
    assert result.returncode == 0, result.stdout + result.stderr[-4000:] + cluster.logs()
    report = json.loads(result.stdout)["results"][0]
    assert report["status"] == "OK" and report["summary"].startswith("2/2 steps in"), report
    assert any("actor/stapo/mask_ratio" in line for line in report["details"]), report


@pytest.mark.timeout(1000)
def test_smoke_names_the_first_error_of_a_failing_job(cluster):
    result = _smoke(cluster, "actor_rollout_ref.actor.policy_loss.tau_p=2")
    assert result.returncode == 1, result.stdout + result.stderr[-4000:]
    report = json.loads(result.stdout)["results"][0]
    assert report["status"] == "FAIL" and "the job failed after" in report["summary"], report
    assert "tau_p" in report["summary"] and "Error" in report["summary"], report["summary"]
