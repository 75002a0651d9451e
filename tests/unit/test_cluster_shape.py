"""The cluster's shape checked before Ray (stapo/verl_plugin/preflight/cluster_shape.py), and at launch against Ray.

Real Hydra composition of the recipe (``stapo.check.compose_run``); this machine's GPUs and Ray cluster are given
to :func:`check_machine` explicitly (the test machine may or may not have either); the launch check runs once
against a real one-node Ray started here with no GPU.
"""

from __future__ import annotations

import copy
import functools
import shutil
import tempfile
import time

import pytest
import yaml
from omegaconf import OmegaConf

from stapo.algorithm.validation import STAPOConfigError
from stapo.check import check_run, compose_run
from stapo.verl_plugin.preflight import cluster_shape
from stapo.verl_plugin.preflight.cluster_shape import (
    RayResourceCheck,
    check_cluster_shape,
    check_machine,
    check_ray_resources,
    check_rollout_layout,
    check_trainer_mode,
)

ROLLOUT = "actor_rollout_ref.rollout"
TP = f"{ROLLOUT}.tensor_model_parallel_size"


@functools.cache
def _composed(preset: str):
    return compose_run([f"model_preset={preset}"])


def gpu_run(*overrides: str, preset: str = "qwen3_8b"):
    """The preset composed once by the recipe's composition, then ``key=value`` set on a copy (a composition costs
    seconds on a loaded 2-core machine; the end-to-end refusals below compose with the overrides themselves)."""
    config = copy.deepcopy(_composed(preset))
    for override in overrides:
        key, _, value = override.lstrip("+").partition("=")
        OmegaConf.update(config, key, yaml.safe_load(value), force_add=True)
    return config


def _verl_replicas_fit(nodes: int, per_node: int, replica: int) -> bool:
    """verl 0.9.1's placement, simulated: ``world // replica`` replicas laid on the GPUs in order (replica.py); it fits
    when every GPU gets a replica and each replica lies on one node, or on whole nodes of its own."""
    world = nodes * per_node
    if world % replica:
        return False  # GPUs left without a replica
    for first in range(0, world, replica):
        on = {gpu // per_node for gpu in range(first, first + replica)}
        whole = all(sum(1 for gpu in range(first, first + replica) if gpu // per_node == node) == per_node
                    for node in on)
        if len(on) > 1 and not whole:
            return False  # a replica split across nodes, sharing them with another replica
    return True


@pytest.mark.parametrize("nodes, per_node, tp, dp", [
    (1, 8, 1, 1), (1, 8, 2, 1), (1, 8, 3, 1), (1, 8, 4, 2), (1, 8, 16, 1), (2, 8, 16, 1), (2, 8, 3, 1),
    (8, 8, 4, 1), (1, 6, 4, 1), (3, 4, 8, 1), (2, 4, 8, 1), (1, 8, 2, 3), (3, 4, 3, 1), (3, 4, 6, 1), (2, 6, 12, 1),
])
def test_the_rollout_replica_must_tile_the_nodes(nodes, per_node, tp, dp):
    config = gpu_run(f"trainer.nnodes={nodes}", f"trainer.n_gpus_per_node={per_node}", f"{TP}={tp}",
                     f"{ROLLOUT}.data_parallel_size={dp}")
    if _verl_replicas_fit(nodes, per_node, tp * dp):
        check_rollout_layout(config)
        return
    with pytest.raises(STAPOConfigError) as error:
        check_rollout_layout(config)
    message = str(error.value)
    assert "\n" not in message
    assert f"{TP}={tp}" in message and f"trainer.n_gpus_per_node={per_node}" in message
    assert (f"{ROLLOUT}.data_parallel_size={dp}" in message) == (dp != 1)


def test_the_issue_s_layout_is_refused_by_stapo_check():
    """``rollout.tensor_model_parallel_size=3`` on 8 GPUs a node passed ``stapo check`` before (issue 61)."""
    with pytest.raises(STAPOConfigError, match=rf"^{TP}=3 \(3 GPUs a rollout replica\) must divide "
                                               r"trainer.n_gpus_per_node=8"):
        check_run(compose_run(["model_preset=qwen3_8b", "trainer.nnodes=1", f"{TP}=3"]), paths=False)


def test_a_gpu_config_on_a_machine_without_a_gpu():
    """``stapo check`` on a laptop notes what it could not check; a launch from there is refused at once."""
    config = gpu_run("trainer.nnodes=1")
    (note,) = check_machine(config, launch=False, gpus=0, cluster=None)
    assert note.startswith("shape: GPUs per node and nodes not checked here: this machine has no CUDA GPU")
    with pytest.raises(STAPOConfigError, match=r"^trainer.device=cuda but this machine has no CUDA GPU"):
        check_machine(config, launch=True, gpus=0, cluster=None)
    # a cluster to join: the Ray cluster's GPUs decide, at launch, wherever the driver runs (a CPU-only head)
    (note,) = check_machine(config, launch=True, gpus=0, cluster="10.0.0.1:6379")
    assert "checked against the Ray cluster at 10.0.0.1:6379 at launch" in note
    # the CPU back-end's workers are Ray slots of its own local Ray: nothing of this machine to check
    assert check_machine(gpu_run(preset="tiny"), launch=True, gpus=0, cluster=None) == []


@pytest.mark.parametrize("gpus, per_node, refused", [(8, 8, False), (8, 4, False), (4, 8, True), (1, 16, True)])
def test_one_node_asks_at_most_this_machine_s_gpus(gpus, per_node, refused):
    config = gpu_run("trainer.nnodes=1", f"trainer.n_gpus_per_node={per_node}", f"{TP}=1")
    for launch in (False, True):
        if not refused:
            assert check_machine(config, launch, gpus=gpus, cluster=None) == [
                f"shape: {per_node} of this machine's {gpus} GPUs"]
            continue
        with pytest.raises(STAPOConfigError) as error:
            check_machine(config, launch, gpus=gpus, cluster=None)
        assert str(error.value) == (
            f"trainer.n_gpus_per_node={per_node} but this machine has {gpus} CUDA GPU{'s' * (gpus != 1)} "
            f"(torch.cuda.device_count()) and trainer.nnodes=1: set trainer.n_gpus_per_node={gpus} or less")


def test_several_nodes_without_a_cluster_to_join():
    """The qwen3 presets' 8 nodes, from a GPU machine with no Ray cluster named or running: noted by ``stapo
    check``, refused by a launch (it would start a one-node Ray and wait)."""
    config = gpu_run()
    (note,) = check_machine(config, launch=False, gpus=8, cluster=None)
    assert note.startswith("shape: trainer.nnodes=8 needs a Ray cluster of 8 nodes, but none is named")
    with pytest.raises(STAPOConfigError, match=r"^trainer.nnodes=8 needs a Ray cluster of 8 nodes"):
        check_machine(config, launch=True, gpus=8, cluster=None)


def test_ray_address_names_the_cluster(monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "10.1.2.3:6379")
    assert cluster_shape.ray_cluster_to_join(gpu_run()) == "10.1.2.3:6379"
    monkeypatch.delenv("RAY_ADDRESS")
    named = compose_run(["model_preset=qwen3_8b", "+ray_kwargs.ray_init.address=10.9.9.9:6379"])
    assert cluster_shape.ray_cluster_to_join(named) == "10.9.9.9:6379"
    assert cluster_shape.ray_cluster_to_join(gpu_run("ray_kwargs.ray_init.address=local")) is None


def test_stapo_train_refuses_a_gpu_preset_on_a_machine_without_a_gpu(monkeypatch, tmp_path, capsys):
    """``stapo train model_preset=qwen3_1p7b ...`` on a machine without a GPU printed its summary and then waited
    for minutes (issue 61): refused before the summary, in one line, exit code 2; ``stapo check`` says OK and
    notes what it could not check."""
    from stapo.cli import main as stapo_main

    monkeypatch.setattr(cluster_shape, "local_gpus", lambda: None)
    monkeypatch.setattr(cluster_shape, "ray_cluster_to_join", lambda config: None)
    monkeypatch.setenv("STAPO_SKIP_PATH_CHECKS", "1")
    monkeypatch.chdir(tmp_path)
    args = ["model_preset=qwen3_1p7b", "trainer.nnodes=1", f"stapo.run_dir={tmp_path / 'run'}"]
    assert stapo_main(["train", *args]) == 2
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [captured.err.strip()]
    assert captured.err.startswith("stapo: trainer.device=cuda but this machine has no CUDA GPU")
    assert "[stapo] preset:" not in captured.out and not (tmp_path / "run").exists()
    assert stapo_main(["check", *args]) == 0
    assert "[stapo] shape: GPUs per node and nodes not checked here" in capsys.readouterr().out


def test_the_recipe_refuses_before_the_pins(monkeypatch):
    """The recipe's ``prepare`` runs the launch checks before it pins the seeded loop: nothing is pinned for a
    refused run."""
    from recipe.stapo.main_stapo import prepare

    monkeypatch.setattr(cluster_shape, "local_gpus", lambda: None)
    monkeypatch.setattr(cluster_shape, "ray_cluster_to_join", lambda config: None)
    config = gpu_run("trainer.nnodes=1", "stapo.seeded_rollouts=true")
    with pytest.raises(STAPOConfigError, match=r"^trainer.device=cuda but this machine has no CUDA GPU"):
        prepare(config)
    assert config.actor_rollout_ref.rollout.agent.default_agent_loop != "stapo_seeded"


@pytest.mark.parametrize("mode", ["separate_async", "colocate_async"])
def test_verl_s_async_trainers_with_seeded_rollouts_are_refused_before_ray(mode):
    """The submission-order replay buffer is sync only: with it pinned an async trainer failed after the cluster
    started, naming a key the user never set. Refused in one line naming both switches; with verl's own loop
    and replay (``stapo.seeded_rollouts=false``, the GPU presets' default) the check lets verl decide."""
    cpu = compose_run(["model_preset=tiny", "algo=grpo", f"trainer.v1.trainer_mode={mode}"])
    with pytest.raises(STAPOConfigError) as error:
        check_run(cpu, paths=False)
    assert str(error.value).startswith(f"trainer.v1.trainer_mode={mode} is one of verl's asynchronous trainers, "
                                       "and stapo.seeded_rollouts=true pins")
    assert "stapo.seeded_rollouts=false" in str(error.value) and "\n" not in str(error.value)
    check_trainer_mode(gpu_run(f"trainer.v1.trainer_mode={mode}"))  # the GPU presets: seeded_rollouts false
    check_trainer_mode(gpu_run(f"trainer.v1.trainer_mode={mode}", "stapo.seeded_rollouts=false", preset="tiny"))
    check_trainer_mode(gpu_run(preset="tiny"))  # the recipe's own trainer


def test_check_with_no_paths_says_what_it_did_not_check():
    assert check_cluster_shape(gpu_run(), here=False) == [
        "shape: GPUs per node and nodes not checked against a machine (--no-paths); the Ray cluster's are at launch"]
    assert check_cluster_shape(gpu_run(preset="tiny"), here=False) == []


@pytest.mark.parametrize("nodes, per_node, cluster_gpus, node_gpus, refused", [
    (1, 8, 8, [8], None), (8, 8, 64, [8] * 8, None), (8, 8, 0, [], "total"), (1, 8, 4, [4], "total"),
    (2, 8, 16, [8, 4, 4], "nodes"), (1, 8, 8, [4, 4], "nodes"), (2, 4, 8, [0, 4, 4], None),
])
def test_the_ray_cluster_holds_the_run_s_gpus(nodes, per_node, cluster_gpus, node_gpus, refused):
    config = gpu_run(f"trainer.nnodes={nodes}", f"trainer.n_gpus_per_node={per_node}", f"{TP}=1")
    ray_nodes = [{"Alive": True, "Resources": {"CPU": 8.0, "GPU": float(gpus)}} for gpus in node_gpus]
    ray_nodes.append({"Alive": False, "Resources": {"GPU": 8.0}})  # a dead node's GPUs are not there
    resources = {"CPU": 64.0, "GPU": float(cluster_gpus)}
    if refused is None:
        check_ray_resources(config, resources, ray_nodes)
        return
    with pytest.raises(STAPOConfigError) as error:
        check_ray_resources(config, resources, ray_nodes)
    message = str(error.value)
    if refused == "total":
        assert message.startswith(f"trainer.nnodes x trainer.n_gpus_per_node asks {nodes} x {per_node} = "
                                  f"{nodes * per_node} GPUs but the Ray cluster has {cluster_gpus} GPUs")
    else:
        fit = sum(gpus >= per_node for gpus in node_gpus)
        assert message.startswith(f"trainer.nnodes={nodes} nodes of trainer.n_gpus_per_node={per_node} GPUs, but "
                                  f"the Ray cluster has {fit} node")


class _Runner:
    """Stands for verl's TaskRunner actor class: records whether it was created."""

    created = 0

    @classmethod
    def remote(cls):
        cls.created += 1

    @classmethod
    def options(cls, **_kwargs):
        return cls


@pytest.mark.slow  # starts processes: out of make test-fast
def test_at_launch_a_real_ray_cluster_without_the_gpus_is_refused_at_once():
    """A real one-node Ray started here without GPUs (as ``run_ppo`` starts one): the TaskRunner is never created,
    the refusal names both numbers, within seconds of Ray being up (verl would wait on its placement groups)."""
    import ray

    config = gpu_run("trainer.nnodes=1", "trainer.n_gpus_per_node=2", f"{TP}=1")
    temp = tempfile.mkdtemp(prefix="r", dir="/tmp")  # short: Ray's socket paths are limited
    ray.init(address="local", num_cpus=1, num_gpus=0, include_dashboard=False, _temp_dir=temp,
             logging_level="ERROR", log_to_driver=False)
    try:
        start = time.monotonic()
        with pytest.raises(STAPOConfigError, match=r"asks 1 x 2 = 2 GPUs but the Ray cluster has 0 GPUs"):
            RayResourceCheck(_Runner, config).remote()
        with pytest.raises(STAPOConfigError):
            RayResourceCheck(_Runner, config).options(runtime_env={}).remote()
        assert time.monotonic() - start < 10 and _Runner.created == 0
        # the CPU back-end's Ray "GPU" slots are what its workers take: the same count passes
        cpu = gpu_run("trainer.n_gpus_per_node=1", preset="tiny")
        with pytest.raises(STAPOConfigError, match=r"has 0 GPU slots \(ray_kwargs.ray_init.num_gpus\)"):
            RayResourceCheck(_Runner, cpu).remote()
    finally:
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)
