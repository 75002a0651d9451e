"""A real two-node Ray cluster on this machine, started by launch/ray/start_head.sh and
start_worker.sh with one logical GPU slot each (the CPU back-end's resource is also called "GPU"):
the preflight against it, then the tiny CPU STAPO run submitted through launch/ray/submit.sh with
trainer.nnodes=2 trainer.n_gpus_per_node=1 (one FSDP rank per node), then the cluster is stopped.

The cluster and the job are shared with tests/launch/test_smoke_cluster.py (tests/launch/conftest.py):
one cluster for the package, stopped after its last test, and its teardown checks that nothing of
it is left. Only the processes the scripts started are signalled; nothing calls `ray stop` (other
people run Ray on the same machine).
"""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import time

import pytest

from tests.launch.local_cluster import REPO, LocalCluster

pytestmark = [pytest.mark.slow]


def _doctor(cluster: LocalCluster, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "stapo.cli", "doctor", "--address", cluster.gcs_address, *args],
        check=False,
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )
    print(f"[launch] stapo doctor {' '.join(args)}: rc={result.returncode} in {time.monotonic() - started:.1f} s")
    return result


@pytest.mark.timeout(400)
def test_preflight_passes_on_the_two_node_cluster(cluster):
    ckpt = cluster.shared / "ckpt"
    # in the job's own runtime env, with the repository uploaded as its working dir, as submit.sh does
    result = _doctor(
        cluster,
        "-v",
        "--runtime-env",
        "launch/ray/runtime_env.yaml",
        "--working-dir",
        str(REPO),
        "trainer.nnodes=2",
        "trainer.n_gpus_per_node=1",
        f"trainer.default_local_dir={ckpt}",
        "model_preset=tiny",
    )
    out = result.stdout
    assert result.returncode == 0, out + result.stderr + cluster.logs()
    assert "2 alive node(s)" in out
    for name in ("resources", "versions", "checkpoint", "plugin", "network"):
        assert f"[ OK ] {name}" in out, out
    assert "shared by all 2 node(s)" in out
    assert out.count("working_dir_files") == 2, out  # the probes ran from the uploaded copy
    # the markers are cleaned up again
    assert not any((ckpt / ".stapo-doctor").glob("*/*.marker"))
    print(out)


@pytest.mark.timeout(300)
def test_preflight_names_what_is_wrong(cluster, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    # workers where `import verl` loads no plugins: STAPO's loss is not registered there
    no_plugins = tmp_path / "no-plugins.yaml"
    no_plugins.write_text('env_vars:\n  VERL_USE_EXTERNAL_PLUGINS: "none"\n')
    result = _doctor(
        cluster,
        "--json",
        "--skip",
        "network,vllm",
        "--runtime-env",
        str(no_plugins),
        "trainer.nnodes=3",
        "trainer.n_gpus_per_node=1",
        f"trainer.default_local_dir={blocker}/ckpt",
    )
    assert result.returncode == 1, result.stdout + result.stderr
    report = {r["name"]: r for r in json.loads(result.stdout)["results"]}
    assert set(report) == {"resources", "versions", "checkpoint", "plugin"}
    assert report["plugin"]["status"] == "FAIL" and "2 of 2 node(s)" in report["plugin"]["summary"]
    assert all("STAPO is not registered in verl" in line for line in report["plugin"]["details"])
    assert report["resources"]["status"] == "FAIL"
    assert "only 2 node(s) have >= 1 'GPU'" in report["resources"]["summary"]
    assert report["checkpoint"]["status"] == "FAIL" and "not writable from 2 node(s)" in report["checkpoint"]["summary"]
    assert all("NotADirectoryError" in line or "FileExistsError" in line for line in report["checkpoint"]["details"])
    assert report["versions"]["status"] == "OK"


@pytest.mark.e2e
@pytest.mark.timeout(1000)  # the shared job (tests/launch/conftest.py) runs in the first test that asks for it
def test_tiny_stapo_job_on_two_nodes_through_submit_sh(cluster, two_node_job):
    """The package's one two-node job: `stapo doctor --smoke` submitted it with launch/ray/submit.sh
    (STAPO_WAIT=1) and kept submit.sh's whole output; tests/launch/test_smoke_cluster.py reads its report."""
    job_id, log, ckpt = two_node_job.job_id, two_node_job.log, two_node_job.ckpt
    assert two_node_job.result.returncode == 0, (
        two_node_job.result.stdout + two_node_job.result.stderr[-4000:] + log[-8000:] + cluster.logs()
    )
    assert job_id and job_id.startswith("stapo-smoke-"), two_node_job.report
    assert f"job {job_id} succeeded" in log, log[-8000:]
    assert f"ray job logs --address {cluster.dashboard_url} --follow {job_id}" in log
    assert f"ray job stop --address {cluster.dashboard_url} {job_id}" in log
    assert "step:2 - " in log and "actor/stapo/mask_ratio" in log, log[-8000:]
    assert "vLLMHttpServer" in log and "training/rollout_probs_diff_max" in log  # verl's vLLM rollout, synced
    # two FSDP ranks, one per node (each node has exactly one slot), wrote to the shared directory
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
    actor = ckpt / "global_step_2" / "actor"
    assert {p.name for p in actor.glob("model_world_size_2_rank_*.pt")} == {
        "model_world_size_2_rank_0.pt",
        "model_world_size_2_rank_1.pt",
    }


@pytest.mark.e2e
@pytest.mark.timeout(1000)
def test_source_current_detects_inside_the_update_across_the_two_ranks(two_node_job):
    """The job's ``policy_loss.source=current``: entropy from the update forward, tau_h over both DP ranks (one
    a node), the step's totals summed over them."""
    assert two_node_job.result.returncode == 0, two_node_job.log[-8000:]
    assert two_node_job.steps.keys() >= {1, 2}, two_node_job.log[-8000:]
    metrics = [two_node_job.steps[s] for s in (1, 2)]
    for m in metrics:
        # step totals (whole numbers), ratios of those totals, thresholds defined wherever candidates exist
        responses = 4 * 8  # data.train_batch_size x rollout.n of the tiny preset
        assert m["actor/stapo/num_response_tokens"] == pytest.approx(m["response_length/mean"] * responses), m
        assert m["actor/stapo/num_spurious"] == int(m["actor/stapo/num_spurious"])
        # verl's console prints each value's repr: the parsed floats are the logged ones, bit for bit
        assert m["actor/stapo/mask_ratio"] == m["actor/stapo/num_spurious"] / m["actor/stapo/num_response_tokens"]
        assert m["actor/stapo/num_candidates"] >= m["actor/stapo/num_spurious"]
        assert m["actor/stapo/num_candidates"] == 0 or math.isfinite(m["actor/stapo/tau_h"]), m
        assert math.isfinite(m["actor/stapo/entropy_p50"]), m
        # source=current does not fold: verl divides by every response token
        assert m["actor/stapo/loss_tokens"] == m["actor/stapo/num_response_tokens"], m
    assert any(m["actor/stapo/num_spurious"] > 0 for m in metrics), metrics


def _ctrl_c_as_in_a_terminal() -> None:
    """SIGINT back to its default in the child, as a command typed in a terminal has it. A suite started
    in the background (``make test &``, nohup, some CI runners) runs with SIGINT ignored, which every
    child inherits; Python then installs no KeyboardInterrupt handler and the interrupt below would be
    lost (it was, once, in a full suite started with nohup ... &)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _sweep(cluster, out, grid: str, *extra: str, popen: bool = False):
    command = [
        sys.executable,
        "-m",
        "stapo.cli",
        "sweep",
        "--launcher",
        "ray",
        "--address",
        cluster.dashboard_url,
        "--poll",
        "1",
        *extra,
        "--grid",
        grid,
        "--seeds",
        "1",
        "--out",
        str(out),
        "--",
        "model_preset=tiny",
        "algo=stapo",
        "trainer.total_training_steps=1",
        "trainer.save_freq=-1",
        "trainer.test_freq=-1",
    ]
    if popen:
        return subprocess.Popen(
            command, cwd=REPO, env=cluster.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            preexec_fn=_ctrl_c_as_in_a_terminal,
        )
    return subprocess.run(command, check=False, cwd=REPO, env=cluster.env, capture_output=True, text=True, timeout=480)


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_sweep_through_the_ray_launcher(cluster):
    """`stapo sweep --launcher ray`: one good run (1 step) and one the recipe refuses, as two Ray jobs
    (``--no-check``: the sweep's own check would refuse the bad cell before submitting anything).

    The sweep is interrupted once the good job is submitted and started again with two jobs in flight:
    it waits for that job instead of submitting it twice; the refused run fails with its error in the
    printed log tail; the comparison holds the good run, checked against its run folder on the shared directory; a third
    call with the good cell only submits nothing.
    """
    from stapo.rundir import read_metrics
    from stapo.runs.machine import machine_kind

    out = cluster.shared / "sweep"
    tau = "actor_rollout_ref.actor.policy_loss.tau_p"
    good = out / "runs" / "tau_p-1e-3" / "seed-1"
    started = time.monotonic()
    first = _sweep(cluster, out, f"{tau}=1e-3,2", "--no-check", popen=True)
    lines = []
    for line in first.stdout:
        lines.append(line)
        if "submitted as" in line:
            first.send_signal(signal.SIGINT)
            break
    # the interrupted sweep exits once its poll returns; on a 2-core machine right after the vLLM job, that
    # took more than 60 s in one full-suite run
    rest, _ = first.communicate(timeout=240)
    text = "".join(lines) + rest
    assert first.returncode == 130 and "jobs in flight keep running on the cluster: stapo-sweep-" in text, text
    job_id = json.loads((good / "sweep_run.json").read_text())["job_id"]
    assert job_id in text

    # both in flight at once: the refused run ends before its driver asks Ray for a GPU
    second = _sweep(cluster, out, f"{tau}=1e-3,2", "--no-check", "--max-parallel", "2")
    log = second.stdout + second.stderr
    assert second.returncode == 1, log[-6000:]
    taken = [f"job {job_id} of an earlier sweep is {state}, taken over" in log for state in ("pending", "running")]
    assert any(taken), log[-6000:]
    assert log.count("submitted as") == 1  # only the refused run was submitted
    assert f"job {job_id} succeeded" in log and "step 1/1 | reward" in log, log[-6000:]
    assert "tau_p=2 seed 1] job stapo-sweep-tau_p-2-s1-" in log and " FAILED: " in log, log[-6000:]
    # the job's log tail ends with the recipe's one-line refusal
    assert f"stapo: {tau} must be a probability in (0, 1)" in log.split(" FAILED: ")[1], log[-6000:]
    bad = out / "runs" / "tau_p-2" / "seed-1"
    assert json.loads((bad / "sweep_run.json").read_text())["status"] == "FAILED"
    assert "tau_p" in (bad / "trainer.log").read_text()
    # the good run: written by the job's driver on the shared directory, compared here
    record = json.loads((good / "sweep_run.json").read_text())
    assert record["status"] == "SUCCEEDED" and record["returncode"] == 0 and record["seconds"] > 0
    # the kind of the node the job's driver ran on (this machine: the cluster is on loopback), from its machine.json
    assert (record["machine"], record["model_built_on"]) == (machine_kind(), None)
    assert json.loads((good / "machine.json").read_text())["machine"] == machine_kind()
    assert json.loads((bad / "sweep_run.json").read_text())["machine"] is None  # refused before it wrote one
    assert "step:1 - " in (good / "trainer.log").read_text()
    step = read_metrics(good)[1]
    groups = json.loads((out / "comparison.json").read_text())["groups"]
    assert [g["group"] for g in groups] == ["tau_p=1e-3"] and groups[0]["steps_trained"] == [1]
    stats = groups[0]["stats"]
    assert stats["mask_ratio"]["mean"] == pytest.approx(step["actor/stapo/mask_ratio"])
    assert stats["entropy_last"]["mean"] == pytest.approx(step["actor/entropy"])
    assert stats["wall_s"]["mean"] == pytest.approx(record["seconds"])
    row = f"| tau_p=1e-3 | 1 | - | - | - | {step['critic/score/mean']:.3f} | "
    assert row in (out / "comparison.md").read_text()

    third = _sweep(cluster, out, f"{tau}=1e-3")
    assert third.returncode == 0, third.stdout[-3000:] + third.stderr[-3000:]
    assert "finished before, skipped" in third.stdout and "submitted" not in third.stdout
    assert row in (out / "comparison.md").read_text()
    print(f"[launch] stapo sweep through the Ray launcher (1 step + 1 refused run): {time.monotonic() - started:.0f} s")
