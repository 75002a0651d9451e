"""`stapo doctor`: preflight checks of a Ray cluster before a multi-node STAPO run.

    stapo doctor --address <head>:6379 trainer.nnodes=4 trainer.n_gpus_per_node=8 \\
        trainer.default_local_dir=/shared/stapo/ckpt

It joins the cluster as a driver and runs one small task pinned to every alive node. Checks:

- ``resources``: enough nodes carry ``trainer.n_gpus_per_node`` of the resource the job asks for
  (``GPU``; the CPU back-end's fake slots are also called ``GPU``) for ``trainer.nnodes`` nodes;
- ``versions``: python, verl, torch, transformers, TransferQueue and stapo on every node equal the
  driver's;
- ``checkpoint``: the checkpoint directory is absolute, writable from every node, and shared: every
  node writes a marker file and every node must see all the markers;
- ``plugin``: STAPO's loss and trainer are registered in verl inside a fresh Ray worker on every
  node (the ``verl.plugins`` entry point loaded there);
- ``network``: NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME, where set, name an interface of the node.

``stapo doctor --smoke [overrides...]`` submits the GPU smoke preset (``qwen3_0p6b_smoke``: vLLM
rollout, FSDP on CUDA, STAPO, 2 steps) to the cluster and reports pass/fail with the first error line.

Exit status: 0 when nothing failed (warnings allowed), 1 when a check failed, 2 on bad usage or
when the cluster cannot be reached.

Layout: ``checks`` (pure functions over what the probes gathered, tested without a cluster),
``probes`` (Ray tasks on the nodes, joining the cluster), ``smoke`` (the smoke job), ``cli``.
"""

from stapo.doctor.checks import FAIL, OK, SKIP, WARN, Node, Result
from stapo.doctor.cli import main

__all__ = ["FAIL", "OK", "SKIP", "WARN", "Node", "Result", "main"]
