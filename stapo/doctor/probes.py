"""The doctor's cluster probes: small Ray tasks pinned to every alive node, and joining the cluster.

Each probe only gathers facts (versions, interfaces, environment, marker files, whether verl
loaded STAPO's plugin); ``examine_cluster`` hands them to the pure checks in
``stapo.doctor.checks``. verl itself is touched only through ``stapo.verl_plugin.registration``,
the recipe's own start-up check, inside a fresh worker.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from stapo.doctor.checks import (
    CHECK_NAMES,
    FAIL,
    PACKAGES,
    Node,
    Result,
    check_checkpoint,
    check_network,
    check_plugin,
    check_resources,
    check_versions,
    check_vllm,
)

MARKER_DIR = ".stapo-doctor"


def local_versions() -> dict[str, str]:
    """Versions of the packages a run depends on, in this process's environment."""
    import platform
    from importlib import metadata

    versions = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "missing"
    return versions


def _interfaces() -> list[str]:
    import socket

    try:
        return sorted(name for _, name in socket.if_nameindex())
    except OSError:
        return []


def probe_node(marker_root: str | None, node_id: str) -> dict[str, Any]:
    """Phase 1 on one node: versions, environment, and this node's marker in the shared directory."""
    import socket

    info: dict[str, Any] = {
        "node_id": node_id,
        "hostname": socket.gethostname(),
        "versions": local_versions(),
        "interfaces": _interfaces(),
        "env": {k: os.environ.get(k) for k in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "STAPO_CACHE")},
        "marker_error": None,
    }
    try:
        import stapo

        info["stapo_path"] = str(Path(stapo.__file__).resolve().parent)
    except Exception as error:  # noqa: BLE001 - reported, not raised
        info["stapo_path"] = f"import failed: {error!r}"
    if marker_root is not None:
        try:
            root = Path(marker_root)
            root.mkdir(parents=True, exist_ok=True)
            marker = root / f"{node_id}.marker"
            marker.write_text(info["hostname"])
            # the write must be visible to the other nodes: flush it to the file system now
            with open(marker, "rb") as handle:
                os.fsync(handle.fileno())
        except OSError as error:
            info["marker_error"] = f"{type(error).__name__}: {error}"
    return info


def read_markers(marker_root: str, expected: list[str], wait_s: float) -> list[str]:
    """Phase 2 on one node: which nodes' markers this node sees (network file systems cache
    directory listings for a few seconds, so an incomplete view is retried until ``wait_s``)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            seen = sorted(p.name[: -len(".marker")] for p in Path(marker_root).glob("*.marker"))
        except OSError:
            seen = []
        if set(expected) <= set(seen) or time.monotonic() >= deadline:
            return seen
        time.sleep(0.5)


def remove_marker(marker_root: str, node_id: str) -> None:
    """Phase 3 on one node: remove this node's marker and, when empty, the probe's directories."""
    root = Path(marker_root)
    try:
        (root / f"{node_id}.marker").unlink(missing_ok=True)
        root.rmdir()
        root.parent.rmdir()
    except OSError:
        pass  # another node's marker is still there, or the parent holds other runs


def probe_plugin() -> dict[str, Any]:
    """In a fresh Ray worker: did ``import verl`` register STAPO's loss and trainer here? The same
    check the recipe runs at start-up, so a worker that passes it runs the job's code path."""
    import traceback

    try:
        from stapo.verl_plugin.registration import REQUIRED_LOSSES, assert_registered
        from stapo.verl_plugin.reproducible.seeding import AGENT_LOOP_NAME

        assert_registered()
        losses = ", ".join(REQUIRED_LOSSES)
        return {"ok": True, "detail": f"policy losses {losses}, trainer 'stapo', agent loop {AGENT_LOOP_NAME!r}"}
    except BaseException as error:  # noqa: BLE001 - the message is the result
        last = traceback.format_exception_only(type(error), error)[-1].strip()
        return {"ok": False, "detail": last[:500]}


def ensure_auth_env() -> None:
    """Recent Ray clusters use token authentication; a driver needs RAY_AUTH_MODE=token to send it."""
    if os.environ.get("RAY_AUTH_MODE"):
        return
    token_path = os.environ.get("RAY_AUTH_TOKEN_PATH") or str(Path.home() / ".ray" / "auth_token")
    if os.environ.get("RAY_AUTH_TOKEN") or (os.path.isfile(token_path) and os.path.getsize(token_path) > 0):
        os.environ["RAY_AUTH_MODE"] = "token"


def probe_vllm() -> dict[str, Any]:
    """In a Ray worker: the vLLM installed there and the parts of its interface verl 0.9.1 calls.

    verl 0.9.1 was written against vLLM 0.24 (its GPU extra's pin): its ``vLLMHttpServer`` calls
    ``AsyncLLM.pause_generation(wait_for_inflight_requests=False, ...)`` on every abort before a weight
    sync, and ``OutputProcessor.abort_requests(request_ids)`` for a single request. Later vLLMs
    deprecated the first argument (0.31) and removed it (0.32), and made ``internal`` a required
    argument of the second (0.31; stapo/verl_plugin/cpu/vllm_shims.py gives it its default again)."""
    import inspect
    from importlib import metadata

    try:
        version = metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return {"version": None}
    plugins = os.environ.get("VLLM_PLUGINS")
    facts: dict[str, Any] = {"version": version, "plugins_env": plugins,
                             "shim_allowed": plugins is None or "stapo_cpu" in plugins.split(",")}
    try:
        from vllm.v1.engine.async_llm import AsyncLLM
        from vllm.v1.engine.output_processor import OutputProcessor

        facts["pause_takes_wait_flag"] = "wait_for_inflight_requests" in inspect.signature(
            AsyncLLM.pause_generation).parameters
        internal = inspect.signature(OutputProcessor.abort_requests).parameters.get("internal")
        facts["abort_needs_internal"] = internal is not None and internal.default is inspect.Parameter.empty
    except Exception as error:  # noqa: BLE001 - reported, not raised
        facts["import_error"] = f"{type(error).__name__}: {error}"[:500]
    return facts


def alive_nodes() -> list[Node]:
    import ray

    available: dict[str, dict[str, float]] = {}
    try:
        from ray._private.state import state as _state

        available = _state.available_resources_per_node()  # no public per-node view
    except Exception:  # noqa: BLE001 - then "free" is shown as "total"
        available = {}
    nodes = []
    for raw in ray.nodes():
        if not raw.get("Alive"):
            continue
        node_id = raw["NodeID"]
        total = {k: float(v) for k, v in raw.get("Resources", {}).items() if not k.startswith("node:")}
        nodes.append(
            Node(
                node_id=node_id,
                ip=raw.get("NodeManagerAddress", "?"),
                hostname=raw.get("NodeManagerHostname", ""),
                is_head=bool(raw.get("Resources", {}).get("node:__internal_head__")),
                total=total,
                available={k: float(v) for k, v in available.get(node_id, total).items()},
            )
        )
    return sorted(nodes, key=lambda n: (not n.is_head, n.ip, n.node_id))


def _pinned(fn, node_id: str, **options):
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    strategy = NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
    return ray.remote(num_cpus=0, scheduling_strategy=strategy, **options)(fn)


def _gather(refs: dict[str, Any], timeout: float, what: str, labels: dict[str, str]) -> tuple[dict, dict[str, str]]:
    """ray.get per node with one deadline; nodes that did not answer are reported, not waited for."""
    import ray

    done: dict[str, Any] = {}
    errors: dict[str, str] = {}
    deadline = time.monotonic() + timeout
    for node_id, ref in refs.items():
        try:
            done[node_id] = ray.get(ref, timeout=max(0.1, deadline - time.monotonic()))
        except ray.exceptions.GetTimeoutError:
            errors[node_id] = f"{labels[node_id]}: {what} did not finish within {timeout:g}s"
            ray.cancel(ref, force=True)
        except Exception as error:  # noqa: BLE001 - a dead node or a failed worker: reported
            errors[node_id] = f"{labels[node_id]}: {what} failed: {type(error).__name__}: {str(error)[:300]}"
    return done, errors


def examine_cluster(args: argparse.Namespace, plan: dict[str, Any]) -> tuple[list[Node], list[Result]]:
    """Probe every alive node and run the checks the user did not skip, in ``CHECK_NAMES`` order."""
    import ray

    nodes = alive_nodes()
    labels = {n.node_id: n.label for n in nodes}
    results: list[Result] = []
    wanted = [c for c in CHECK_NAMES if c not in args.skip]

    if "resources" in wanted:
        results.append(check_resources(nodes, plan["nnodes"], plan["per_node"], args.resource))

    directory = plan["checkpoint_dir"]
    run_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:8]}"
    marker_root = None
    if "checkpoint" in wanted and directory and os.path.isabs(directory):
        marker_root = str(Path(directory) / MARKER_DIR / run_id)

    refs = {n.node_id: _pinned(probe_node, n.node_id).remote(marker_root, n.node_id) for n in nodes}
    plugin_refs = {}
    if "plugin" in wanted:
        # max_calls=1: a fresh worker process, so the check sees what `import verl` does there
        plugin_refs = {n.node_id: _pinned(probe_plugin, n.node_id, max_calls=1).remote() for n in nodes}
    probes, probe_errors = _gather(refs, args.timeout, "the probe task", labels)
    if probe_errors:
        results.append(
            Result(
                "nodes",
                FAIL,
                f"{len(probe_errors)} of {len(nodes)} node(s) did not run a probe task",
                list(probe_errors.values()),
                "check `ray status` and the raylet logs of those nodes (RAY_TEMP_DIR/session_latest/logs); a node "
                "that cannot start Python workers cannot run the job either",
            )
        )

    if "versions" in wanted:
        results.append(check_versions(local_versions(), probes, labels))

    if "checkpoint" in wanted:
        seen: dict[str, list[str]] = {}
        if marker_root is not None and probes:
            writers = [k for k, p in probes.items() if not p.get("marker_error")]
            read_refs = {k: _pinned(read_markers, k).remote(marker_root, writers, args.shared_wait) for k in probes}
            seen, read_errors = _gather(read_refs, args.timeout + args.shared_wait, "reading the markers", labels)
            for node_id, error in read_errors.items():
                probes[node_id] = dict(probes[node_id], marker_error=error)
            cleanup = [_pinned(remove_marker, k).remote(marker_root, k) for k in probes]
            ray.wait(cleanup, num_returns=len(cleanup), timeout=args.timeout)
        results.append(check_checkpoint(directory, probes, seen, labels))

    if "plugin" in wanted:
        plugins, plugin_errors = _gather(plugin_refs, args.timeout, "the plugin check", labels)
        for node_id, error in plugin_errors.items():
            plugins[node_id] = {"ok": False, "detail": error}
        results.append(check_plugin(plugins, labels))

    if "network" in wanted:
        results.append(check_network(probes, labels))

    if "vllm" in wanted:
        vllm_refs = {n.node_id: _pinned(probe_vllm, n.node_id).remote() for n in nodes}
        facts, vllm_errors = _gather(vllm_refs, args.timeout, "the vLLM probe", labels)
        for node_id, error in vllm_errors.items():
            facts[node_id] = {"version": "?", "import_error": error}
        results.append(check_vllm(facts, labels))
    return nodes, results


def gcs_reachable(address: str, timeout: float) -> str | None:
    """None when host:port accepts a TCP connection (Ray's own connect retries for many minutes)."""
    import socket

    if address in ("auto", "local") or address.startswith("ray://") or ":" not in address:
        return None
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            return None
    except (OSError, ValueError) as error:
        return f"{type(error).__name__}: {error}"


def connect_watchdog(address: str, timeout: float):
    """ray.init can block for minutes on a half-alive cluster: give up after ``timeout`` seconds."""
    import threading

    def expire() -> None:
        print(
            f"stapo doctor: error: joining the Ray cluster at {address!r} took more than {timeout:g}s\n"
            f"fix: {CONNECT_FIX}",
            file=sys.stderr,
            flush=True,
        )
        os._exit(2)

    timer = threading.Timer(timeout, expire)
    timer.daemon = True
    timer.start()
    return timer


CONNECT_FIX = (
    "start it (launch/ray/start_head.sh) and pass --address <head>:<GCS port> or set RAY_ADDRESS; run the "
    "doctor on a node of the cluster (or submit it as a Ray job); with token authentication the head's "
    "~/.ray/auth_token (or RAY_AUTH_TOKEN) must be available here"
)
