"""The cluster's shape: the GPUs a run asks for against the rollout layout, this machine and the Ray cluster.

A run asks for ``trainer.nnodes x trainer.n_gpus_per_node`` GPUs. verl reserves them as placement groups inside its
TaskRunner: a cluster with fewer never schedules them and the run waits without an error; a rollout replica
(``tensor x data x pipeline`` parallel GPUs, verl's ``RolloutReplica``) that does not tile the nodes fails inside a
worker. Checked here in three places:

- :func:`check_rollout_layout`, every check: the replica's GPUs divide the GPUs per node (or a whole number of
  nodes) and the whole cluster;
- :func:`check_machine`, ``stapo check``/``stapo train``/the recipe with the paths checked: this machine's GPUs
  for a one-node run that starts its own Ray; ``stapo check`` on a machine without a GPU (a laptop checking a
  cluster's config) notes what it could not check, a launch there is refused at once;
- :class:`RayResourceCheck`, the recipe's driver once Ray is initialised or joined (verl's ``run_ppo``): the Ray
  cluster's GPUs against the run's, refused with both numbers before verl creates a placement group.

verl's asynchronous trainers are refused here too (:func:`check_trainer_mode`): the seeded agent loop and the
submission-order replay buffer the recipe pins are sync only (docs/reproducibility.md).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from omegaconf import OmegaConf

from stapo.algorithm.validation import STAPOConfigError, check_positive_int

ROLLOUT = "actor_rollout_ref.rollout"
# the sizes verl multiplies into one rollout replica's GPUs (verl/workers/rollout/replica.py, RolloutReplica)
REPLICA_SIZES = ("tensor_model_parallel_size", "data_parallel_size", "pipeline_model_parallel_size")
GPU_DEVICES = ("cuda", "npu")
# verl 0.9.1's trainer.v1.trainer_mode values whose replay buffer is verl's ReplayBufferAsync
ASYNC_MODES = ("colocate_async", "separate_async")
SEEDED_KEY = "stapo.seeded_rollouts"
RAY_ADDRESS_KEY = "ray_kwargs.ray_init.address"


def _get(config, key: str, default=None):
    return OmegaConf.select(config, key, default=default)


def world(config) -> tuple[int, int]:
    """(nodes, GPUs per node), each a positive integer or refused naming its key."""
    return (check_positive_int("trainer.nnodes", _get(config, "trainer.nnodes")),
            check_positive_int("trainer.n_gpus_per_node", _get(config, "trainer.n_gpus_per_node")))


def check_rollout_layout(config) -> None:
    """One rollout replica's GPUs (tensor x data x pipeline parallel) tile the nodes and the cluster.

    verl builds ``world // replica`` replicas, each on ``min(replica, n_gpus_per_node)`` GPUs of a node
    (``replica.py`` asserts that ``n_gpus_per_node`` divides a larger replica): 3-way tensor parallelism on 8 GPUs
    would leave GPUs without a replica and split one across nodes."""
    nodes, per_node = world(config)
    sizes = {size: _get(config, f"{ROLLOUT}.{size}", 1) for size in REPLICA_SIZES}
    for size, value in sizes.items():
        check_positive_int(f"{ROLLOUT}.{size}", value)
    replica = 1
    for value in sizes.values():
        replica *= int(value)
    fits_node = per_node % replica == 0 if replica <= per_node else replica % per_node == 0
    if fits_node and (nodes * per_node) % replica == 0:
        return
    named = " x ".join(f"{ROLLOUT}.{size}={value}" for size, value in sizes.items() if value != 1 or
                       size == "tensor_model_parallel_size")
    raise STAPOConfigError(
        f"{named} ({replica} GPUs a rollout replica) must divide trainer.n_gpus_per_node={per_node} (or be a "
        f"multiple of it) and the cluster's trainer.nnodes x trainer.n_gpus_per_node={nodes * per_node} GPUs: "
        "verl places whole replicas on each node"
    )


def check_trainer_mode(config) -> None:
    """verl's asynchronous trainers with the recipe's seeded rollouts are refused: the submission-order replay buffer
    is sync only (verl requires its ReplayBufferAsync there) and would fail after the cluster started, naming a key
    the user never set. ``stapo.seeded_rollouts=false`` hands the run to verl's own loop and replay buffer."""
    mode = _get(config, "trainer.v1.trainer_mode", None)
    if mode in ASYNC_MODES and _get(config, SEEDED_KEY, True) is True:
        raise STAPOConfigError(
            f"trainer.v1.trainer_mode={mode} is one of verl's asynchronous trainers, and {SEEDED_KEY}=true pins the "
            "seeded agent loop and the submission-order replay buffer, which are sync only: set "
            f"{SEEDED_KEY}=false (verl's own loop and replay, not reproducible) or trainer.v1.trainer_mode=stapo"
        )


def ray_cluster_to_join(config) -> str | None:
    """The Ray cluster ``ray.init`` would join: ``ray_kwargs.ray_init.address``, ``RAY_ADDRESS``, or one started with
    ``ray start`` on this machine (Ray's own lookup); None when the run would start a one-node Ray of its own."""
    given = _get(config, RAY_ADDRESS_KEY, None) or os.environ.get("RAY_ADDRESS")
    if given and given != "local":
        return str(given)
    if given == "local":
        return None
    try:
        from ray._private.services import canonicalize_bootstrap_address

        return canonicalize_bootstrap_address(None)
    except Exception:  # no Ray, or its lookup failed: as if none were running
        return None


def local_gpus() -> int | None:
    """CUDA devices this process sees; None without CUDA."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else None


def check_machine(config, launch: bool, gpus: int | None = None, cluster: str | None = "lookup") -> list[str]:
    """This machine against the run's GPUs; notes saying what could not be checked here.

    ``launch``: the caller starts the run from here (``stapo train``, the recipe), so a GPU run on a machine
    without a GPU and without a Ray cluster to join is refused at once; ``stapo check`` notes it instead.
    ``gpus`` and ``cluster`` default to this machine's (:func:`local_gpus`, :func:`ray_cluster_to_join`)."""
    device = _get(config, "trainer.device", "cuda")
    nodes, per_node = world(config)
    if device not in GPU_DEVICES:
        return []  # the CPU back-end's "GPUs" are Ray slots of its own local Ray (ray_kwargs.ray_init.num_gpus)
    cluster = ray_cluster_to_join(config) if cluster == "lookup" else cluster
    if device == "npu":
        return ["shape: GPUs per node and nodes not checked here for trainer.device=npu (the Ray cluster's "
                "resources are, at launch)"]
    gpus = local_gpus() if gpus is None else gpus
    asked = f"trainer.nnodes={nodes} x trainer.n_gpus_per_node={per_node}"
    if cluster:
        return [f"shape: {asked} checked against the Ray cluster at {cluster} at launch (this machine: "
                f"{gpus or 'no'} GPU{'s' * (gpus != 1)})"]
    if not gpus:
        if launch:
            raise STAPOConfigError(
                f"trainer.device={device} but this machine has no CUDA GPU (torch.cuda.is_available() is false) and "
                "no Ray cluster to join (RAY_ADDRESS, ray_kwargs.ray_init.address, or `ray start` here): run it on "
                "a GPU node or the cluster's head, or use a CPU preset (model_preset=tiny)"
            )
        return [f"shape: GPUs per node and nodes not checked here: this machine has no CUDA GPU and no Ray "
                f"cluster to join; {asked} is checked where the run starts (and against Ray's GPUs at launch)"]
    if nodes > 1:
        if launch:
            raise STAPOConfigError(
                f"trainer.nnodes={nodes} needs a Ray cluster of {nodes} nodes, but none is named (RAY_ADDRESS, "
                "ray_kwargs.ray_init.address) or running here: a run from here would start a one-node Ray; start "
                "the cluster (launch/README.md) or set trainer.nnodes=1"
            )
        return [f"shape: trainer.nnodes={nodes} needs a Ray cluster of {nodes} nodes, but none is named "
                "(RAY_ADDRESS, ray_kwargs.ray_init.address) or running here: run it from the cluster's head "
                "(launch/README.md), or set trainer.nnodes=1 for this machine"]
    if per_node > gpus:
        raise STAPOConfigError(
            f"trainer.n_gpus_per_node={per_node} but this machine has {gpus} CUDA GPU{'s' * (gpus != 1)} "
            f"(torch.cuda.device_count()) and trainer.nnodes=1: set trainer.n_gpus_per_node={gpus} or less"
        )
    return [f"shape: {per_node} of this machine's {gpus} GPUs"]


def check_cluster_shape(config, here: bool = True, launch: bool = False) -> list[str]:
    """The rollout layout and the trainer mode always; this machine's GPUs when ``here`` (the paths are checked
    too: the config is for this machine). Returns the notes."""
    check_rollout_layout(config)
    check_trainer_mode(config)
    if here:
        return check_machine(config, launch)
    if _get(config, "trainer.device", "cuda") in GPU_DEVICES:
        return ["shape: GPUs per node and nodes not checked against a machine (--no-paths); the Ray cluster's are "
                "at launch"]
    return []


def shape_line(config) -> str:
    """``8 nodes x 8 GPUs = 64 GPUs (a Ray cluster of 8 nodes; RAY_ADDRESS is not set)``: the size of the run, and
    the cluster a run of several nodes joins (named by ``RAY_ADDRESS`` or ``ray_kwargs.ray_init.address``; without
    one the run must start on the head of a cluster started with ``ray start``)."""
    device = _get(config, "trainer.device", "cuda")
    nodes, per_node = _get(config, "trainer.nnodes"), _get(config, "trainer.n_gpus_per_node")
    units = "GPU" if device in GPU_DEVICES else "worker"
    text = f"{nodes} node{'s' * (nodes != 1)} x {per_node} {units}{'s' * (per_node != 1)}"
    if isinstance(nodes, int) and isinstance(per_node, int) and nodes > 1:
        named = _get(config, RAY_ADDRESS_KEY, None) or os.environ.get("RAY_ADDRESS")
        joins = f"RAY_ADDRESS={named}" if named else "RAY_ADDRESS is not set"
        text += f" = {nodes * per_node} {units}s (a Ray cluster of {nodes} nodes; {joins})"
    return text


def check_ray_resources(config, resources: Mapping[str, float], nodes: Sequence[Mapping] = ()) -> None:
    """The Ray cluster holds the run's GPUs (``resources``: ``ray.cluster_resources()``; ``nodes``: ``ray.nodes()``,
    for the nodes with ``n_gpus_per_node`` each). The CPU back-end's workers are Ray "GPU" slots too
    (``ray_kwargs.ray_init.num_gpus``), so the same count applies to ``trainer.device=cpu``."""
    count, per_node = world(config)
    wanted = count * per_node
    have = int(resources.get("GPU", 0) or resources.get("NPU", 0))
    gpu = _get(config, "trainer.device", "cuda") in GPU_DEVICES
    slots = "GPUs" if gpu else "GPU slots (ray_kwargs.ray_init.num_gpus)"
    if have < wanted:
        raise STAPOConfigError(
            f"trainer.nnodes x trainer.n_gpus_per_node asks {count} x {per_node} = {wanted} GPUs but the Ray cluster "
            f"has {have} {slots if have != 1 else slots.replace('GPUs', 'GPU').replace('slots', 'slot')}: verl's "
            "placement groups would wait forever; start more nodes or lower the two keys"
        )
    alive = [node for node in nodes if node.get("Alive", True)]
    if alive:
        fit = sum(1 for node in alive if (node.get("Resources") or {}).get("GPU", 0) >= per_node)
        if fit < count:
            raise STAPOConfigError(
                f"trainer.nnodes={count} nodes of trainer.n_gpus_per_node={per_node} GPUs, but the Ray cluster has "
                f"{fit} node{'s' * (fit != 1)} with {per_node} or more {slots} ({have} in all): verl places each "
                "node's GPUs together and would wait forever"
            )


class RayResourceCheck:
    """verl's TaskRunner class for ``run_ppo``, which initialises or joins Ray and then calls ``.remote()`` (or
    ``.options(...).remote()``): the cluster's resources are checked there, before verl's TaskRunner and its
    placement groups exist."""

    def __init__(self, runner_class, config):
        self._runner_class, self._config = runner_class, config

    def _check(self) -> None:
        import ray

        check_ray_resources(self._config, ray.cluster_resources(), ray.nodes())

    def remote(self, *args, **kwargs):
        self._check()
        return self._runner_class.remote(*args, **kwargs)

    def options(self, *args, **kwargs):
        self._check()
        return self._runner_class.options(*args, **kwargs)
