"""The GPU smoke preset (conf/model_preset/qwen3_0p6b_smoke.yaml) and `stapo doctor --smoke`.

Composition, the recipe's and verl's driver-side checks, and the doctor's reading of a job log run
here. The smoke run itself needs a CUDA GPU, vLLM and the hub (Qwen/Qwen3-0.6B-Base): it is skipped
on machines without a GPU, with the reason in the skip message.
"""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
from verl.trainer.ppo.utils import need_critic, need_reference_policy
from verl.utils.config import validate_config

from stapo.doctor import checks, tracebacks
from stapo.doctor.smoke import SMOKE_PRESET, job_address, smoke_overrides, total_steps
from stapo.verl_plugin.preflight.run_checks import validate_run_config
from tests.e2e.test_compose import compose_recipe, resolved_recipe
from tests.launch.local_cluster import REPO


def test_smoke_preset_composes_as_a_gpu_stapo_run():
    cfg = compose_recipe(f"model_preset={SMOKE_PRESET}", "algo=stapo")
    model, actor, rollout = cfg.actor_rollout_ref.model, cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout
    assert model.path == "Qwen/Qwen3-0.6B-Base"
    assert rollout.name == "vllm" and rollout.mode == "async" and rollout.tensor_model_parallel_size == 1
    assert cfg.trainer.device == "cuda" and (cfg.trainer.nnodes, cfg.trainer.n_gpus_per_node) == (1, 1)
    assert cfg.trainer.total_training_steps == 2 and cfg.trainer.save_freq == 2
    assert cfg.trainer.resume_mode == "disable"  # never resumes an earlier smoke checkpoint
    assert actor.policy_loss.loss_mode == "masked_clip" and actor.policy_loss.token_mask == "stapo"
    assert actor.strategy == "fsdp2" and actor.use_dynamic_bsz is True
    # generated data only: nothing but the model comes from the internet
    assert cfg.stapo.synthetic_task == "arithmetic"
    assert str(cfg.data.train_files).startswith(str(cfg.stapo.synthetic_data_dir))
    # the same recipe checks the driver runs before any worker starts
    validate_run_config(cfg)


def test_smoke_preset_passes_verls_validation():
    cfg = resolved_recipe(f"model_preset={SMOKE_PRESET}", "algo=stapo")
    validate_config(config=cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    assert cfg.trainer.experiment_name == "smoke-stapo"
    # 8 prompts x 4 samples split into mini-batches of 8 prompts: one update per step
    assert cfg.data.train_batch_size * cfg.actor_rollout_ref.rollout.n == 32


def test_smoke_overrides_put_the_users_last():
    assert smoke_overrides([]) == [f"model_preset={SMOKE_PRESET}", "algo=stapo"]
    assert smoke_overrides(["algo=grpo", "trainer.n_gpus_per_node=8"]) == [
        f"model_preset={SMOKE_PRESET}", "algo=grpo", "trainer.n_gpus_per_node=8"]
    assert smoke_overrides(["model_preset=qwen3_8b"]) == ["algo=stapo", "model_preset=qwen3_8b"]
    assert total_steps(["trainer.total_training_steps=5"]) == 5 and total_steps([]) == 2


@pytest.mark.parametrize(
    "address, api",
    [("10.0.0.1:6379", "http://10.0.0.1:8265"), ("http://head:8265/", "http://head:8265"),
     ("auto", "http://127.0.0.1:8265"), ("ray://10.0.0.2:10001", "http://10.0.0.2:8265")],
)
def test_smoke_job_address_from_the_gcs_address(address, api, monkeypatch):
    monkeypatch.delenv("RAY_DASHBOARD_PORT", raising=False)
    assert job_address(address) == api


RAY_REMOTE_FAILURE = """\
(TaskRunnerV1 pid=4242, ip=10.0.0.1) step:1 - critic/score/mean:0.25 - timing_s/step:41.2
Traceback (most recent call last):
  File "/opt/stapo/recipe/stapo/main_stapo.py", line 67, in main
    run_ppo(config, task_runner_class=TaskRunnerV1)
ray.exceptions.RayTaskError(OutOfMemoryError): ray::TaskRunnerV1.run() (pid=4242, ip=10.0.0.1)
  File "/usr/lib/python3/dist-packages/verl/workers/actor/dp_actor.py", line 400, in update_policy
    loss.backward()
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.1 GiB
[stapo-ray 10:04:05] error: job stapo-smoke-1 did not succeed: Job 'stapo-smoke-1' failed
"""

CHAINED = """\
\x1b[36m(WorkerDict pid=99)\x1b[0m Traceback (most recent call last):
\x1b[36m(WorkerDict pid=99)\x1b[0m   File "x.py", line 3, in f
\x1b[36m(WorkerDict pid=99)\x1b[0m KeyError: 'model.layers.0.mlp.gate_proj.weight'
\x1b[36m(WorkerDict pid=99)\x1b[0m During handling of the above exception, another exception occurred:
\x1b[36m(WorkerDict pid=99)\x1b[0m Traceback (most recent call last):
\x1b[36m(WorkerDict pid=99)\x1b[0m RuntimeError: weight sync failed
"""


@pytest.mark.parametrize(
    "log, expected",
    [
        (RAY_REMOTE_FAILURE, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."),
        (CHAINED, "KeyError: 'model.layers.0.mlp.gate_proj.weight'"),
        ("INFO ok\nERROR: no space left on device\n[stapo-ray 1] error: job x failed\n", "ERROR: no space left"),
        ("[stapo-ray 1] error: job x did not succeed\n", "[stapo-ray 1] error: job x did not succeed"),
        ("WARNING: deprecated, will be an error later\nall good\n", None),
        ("Error executing job with overrides: []\nValueError: data.train_batch_size=3 must be > 0\n",
         "ValueError: data.train_batch_size=3 must be > 0"),
        # the recipe's own one-line refusal (exit 2, no traceback) is the reason, over any later noise
        ("WARNING: no accelerator\nstapo: trainer.logger='consol' is not one of verl's loggers\n"
         "[stapo-ray 1] error: job x failed\n", "stapo: trainer.logger='consol' is not one of verl's loggers"),
    ],
)
def test_first_error_line_names_the_cause(log, expected):
    found = tracebacks.first_error_line(log)
    assert (found is None) if expected is None else found.startswith(expected), found


STEP = "step:{step} - critic/score/mean:0.125 - actor/stapo/mask_ratio:0.004 - timing_s/step:{seconds}\n"


def test_check_smoke_passes_only_with_every_step():
    log = STEP.format(step=1, seconds=40.0) + STEP.format(step=2, seconds=30.5)
    passed = checks.check_smoke("job-1", True, 300.0, log, 2, "/tmp/job-1.log")
    assert passed.status == checks.OK and passed.summary.startswith("2/2 steps in 300 s")
    assert "step 2 actor/stapo/mask_ratio = 0.004" in passed.details

    short = checks.check_smoke("job-1", True, 90.0, STEP.format(step=1, seconds=40.0), 2, "/tmp/job-1.log")
    assert short.status == checks.FAIL and "without its step 2 (last logged step: 1)" in short.summary

    failed = checks.check_smoke("job-2", False, 120.0, RAY_REMOTE_FAILURE, 2, "/tmp/job-2.log")
    assert failed.status == checks.FAIL
    assert "at step 2 of 2: torch.OutOfMemoryError: CUDA out of memory" in failed.summary
    assert "gpu_memory_utilization" in failed.fix and "/tmp/job-2.log" in failed.details[0]

    stopped = checks.check_smoke("job-3", False, 1800.0, STEP.format(step=1, seconds=40.0), 2, "/tmp/j.log", 1800)
    assert stopped.status == checks.FAIL and "did not finish within 1800 s" in stopped.summary


def test_smoke_refuses_when_no_job_api_answers():
    result = subprocess.run(
        [sys.executable, "-m", "stapo.cli", "doctor", "--smoke", "--address", "127.0.0.1:1"],
        check=False, cwd=REPO, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "no Ray job API answers at http://127.0.0.1:8265" in result.stderr


def _gpu_reason() -> str | None:
    import torch

    if not torch.cuda.is_available():
        return "the smoke run needs a CUDA GPU (none on this machine); it also needs vLLM and the hub"
    try:
        import vllm  # noqa: F401
    except ImportError:
        return "the smoke run needs vLLM (the project's Docker image has it); not installed here"
    if shutil.which("ray") is None:
        return "the smoke run needs the ray command line"
    return None


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(2400)
@pytest.mark.skipif(_gpu_reason() is not None, reason=_gpu_reason() or "")
def test_smoke_run_on_a_gpu(tmp_path):
    """The real thing: a one-node Ray cluster on this GPU machine, the smoke job through the doctor."""
    from tests.launch.local_cluster import start_cluster

    cluster = start_cluster(tmp_path / "ray", tmp_path / "shared", num_cpus=8, num_gpus=1)
    try:
        result = subprocess.run(
            [sys.executable, "-m", "stapo.cli", "doctor", "--smoke", "--address", cluster.dashboard_url,
             f"trainer.default_local_dir={tmp_path / 'ckpt'}"],
            check=False, cwd=REPO, env=cluster.env, capture_output=True, text=True, timeout=2300,
        )
    finally:
        cluster.stop()
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "[ OK ] smoke  2/2 steps" in result.stdout
