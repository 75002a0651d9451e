"""`stapo doctor --smoke` against a real two-node Ray cluster on this machine (launch/ray scripts).

The GPU preset cannot run here, so the smoke path is driven with the tiny CPU preset in its place
(`model_preset=tiny` after `--smoke`): the same submission through submit.sh, the same wait, the same
reading of the job's log. One job passes, one fails on a bad setting and must name it.

The cluster and the passing job are the package's shared ones (tests/launch/conftest.py): the job
is the tiny two-node STAPO run that tests/launch/test_cluster.py checks as a submit.sh job.
"""

from __future__ import annotations

import json

import pytest

from tests.launch.local_cluster import smoke

pytestmark = [pytest.mark.slow, pytest.mark.e2e]


@pytest.mark.timeout(1000)
def test_smoke_reports_a_passing_job(cluster, two_node_job):
    result = two_node_job.result
    assert result.returncode == 0, result.stdout + result.stderr[-4000:] + cluster.logs()
    report = two_node_job.report
    assert report["status"] == "OK" and report["summary"].startswith("2/2 steps in"), report
    assert any("actor/stapo/mask_ratio" in line for line in report["details"]), report


@pytest.mark.timeout(1000)
def test_smoke_names_the_first_error_of_a_failing_job(cluster):
    # --no-check: submitted as is (the doctor would refuse it here), so the job itself fails at start-up
    bad = "actor_rollout_ref.actor.policy_loss.tau_p=2"
    result = smoke(cluster, "trainer.save_freq=-1", bad, flags=("--no-check",))
    assert result.returncode == 1, result.stdout + result.stderr[-4000:]
    report = json.loads(result.stdout)["results"][0]
    assert report["status"] == "FAIL" and "the job failed after" in report["summary"], report
    # the recipe's one-line refusal is the reason the report gives
    assert "stapo: actor_rollout_ref.actor.policy_loss.tau_p must be a probability" in report["summary"], report
