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
- ``plugin``: ``verl.trainer.ppo.core_algos.get_policy_loss_fn("stapo")`` works inside a fresh
  Ray worker on every node (the ``verl.plugins`` entry point loaded there);
- ``network``: NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME, where set, name an interface of the node.

Exit status: 0 when nothing failed (warnings allowed), 1 when a check failed, 2 on bad usage or
when the cluster cannot be reached. The checks themselves (``check_*``) are pure functions over
what the probes gathered, so they are tested without a cluster.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

PACKAGES = ("verl", "torch", "transformers", "TransferQueue", "stapo")
CHECK_NAMES = ("resources", "versions", "checkpoint", "plugin", "network")
MARKER_DIR = ".stapo-doctor"
OK, WARN, FAIL, SKIP = "OK", "WARN", "FAIL", "SKIP"


@dataclass
class Result:
    name: str
    status: str
    summary: str
    details: list[str] = field(default_factory=list)
    fix: str = ""


@dataclass
class Node:
    """One alive Ray node as the GCS describes it."""

    node_id: str
    ip: str
    hostname: str
    is_head: bool
    total: dict[str, float]
    available: dict[str, float] = field(default_factory=dict)

    @property
    def label(self) -> str:
        head = ", head" if self.is_head else ""
        return f"node {self.node_id[:8]} ({self.hostname or self.ip} {self.ip}{head})"


# ----------------------------------------------------------------------------- probes (run on nodes)


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
    """In a fresh Ray worker: does `import verl` register STAPO's policy loss here?"""
    import traceback

    try:
        from verl.trainer.ppo.core_algos import get_policy_loss_fn

        fn = get_policy_loss_fn("stapo")
        return {"ok": True, "detail": f"{fn.__module__}.{fn.__qualname__}"}
    except BaseException as error:  # noqa: BLE001 - the message is the result
        last = traceback.format_exception_only(type(error), error)[-1].strip()
        return {"ok": False, "detail": last[:500]}


# ----------------------------------------------------------------------------- checks (pure)


def check_resources(nodes: list[Node], nnodes: int, per_node: float, resource: str) -> Result:
    need = nnodes * per_node
    fitting = [n for n in nodes if n.total.get(resource, 0) >= per_node]
    total = sum(n.total.get(resource, 0) for n in nodes)
    free = sum(n.available.get(resource, 0) for n in nodes)
    shape = f"trainer.nnodes={nnodes} x trainer.n_gpus_per_node={per_node:g} = {need:g} '{resource}'"
    details = [f"{n.label}: {resource} {n.total.get(resource, 0):g}" for n in nodes]
    if len(fitting) < nnodes:
        have = max((n.total.get(resource, 0) for n in nodes), default=0)
        if not any(resource in n.total for n in nodes):
            why = f"no node announces the resource '{resource}'"
            fix = (
                f"start the nodes with {resource} slots (GPU nodes announce 'GPU' by themselves; for CPU "
                "runs set RAY_NUM_GPUS=<slots> for start_head.sh/start_worker.sh), or pass --resource "
                "with the name your nodes announce"
            )
        else:
            why = f"only {len(fitting)} node(s) have >= {per_node:g} '{resource}' (the largest has {have:g})"
            fix = (
                "start more worker nodes (launch/ray/start_worker.sh), or lower trainer.nnodes / "
                "trainer.n_gpus_per_node to the cluster's shape: verl places n_gpus_per_node workers on each "
                "of nnodes nodes"
            )
        return Result("resources", FAIL, f"{shape} needed; {why}", details, fix)
    if free < need:
        return Result(
            "resources",
            WARN,
            f"{shape}: the cluster has {total:g} but only {free:g} free now (another job holds the rest)",
            details,
            "wait for the other job or stop it (`ray job list`, `ray job stop <id>`); the run would wait for resources",
        )
    extra = f"; {len(fitting) - nnodes} more node(s) fit and stay idle" if len(fitting) > nnodes else ""
    return Result("resources", OK, f"{shape}: {len(fitting)} node(s) fit, {free:g} free{extra}", details)


def check_versions(driver: dict[str, str], probes: dict[str, dict[str, Any]], labels: dict[str, str]) -> Result:
    mismatches, details = [], []
    for node_id, probe in sorted(probes.items()):
        versions = probe["versions"]
        diffs = [f"{k} {versions.get(k)} (driver {v})" for k, v in driver.items() if versions.get(k) != v]
        where = probe.get("stapo_path", "?")
        details.append(f"{labels.get(node_id, node_id)}: " + (", ".join(diffs) if diffs else "same") + f"; stapo from {where}")
        if diffs:
            mismatches.append(f"{labels.get(node_id, node_id)}: " + ", ".join(diffs))
    driver_line = ", ".join(f"{k} {v}" for k, v in driver.items())
    if mismatches:
        return Result(
            "versions",
            FAIL,
            f"{len(mismatches)} node(s) differ from the driver ({driver_line})",
            mismatches + ["--"] + details,
            "run every node from the same image tag (docker/README.md) or install the same pins everywhere "
            "(pip install -c requirements/constraints-cpu.txt -e . on CPU machines); Ray pickles code and "
            "configs between nodes, and verl's internals change between versions",
        )
    return Result("versions", OK, f"{len(probes)} node(s) match the driver: {driver_line}", details)


def check_checkpoint(
    directory: str | None, probes: dict[str, dict[str, Any]], seen: dict[str, list[str]], labels: dict[str, str]
) -> Result:
    if directory is None:
        if len(probes) > 1:
            return Result(
                "checkpoint",
                FAIL,
                "no checkpoint directory given: a multi-node run must save to storage every node shares",
                fix="pass --checkpoint-dir /shared/path (or trainer.default_local_dir=/shared/path, or set "
                "STAPO_CHECKPOINT_DIR), the same path the job's trainer.default_local_dir uses",
            )
        return Result("checkpoint", SKIP, "no checkpoint directory given (one node: any local path works)")
    if not os.path.isabs(directory):
        return Result(
            "checkpoint",
            FAIL,
            f"{directory!r} is relative: every Ray worker resolves it in its own working directory, so the "
            "nodes would write to different places",
            fix="set trainer.default_local_dir to an absolute path on shared storage (NFS, Lustre, a PVC)",
        )
    errors = [f"{labels.get(k, k)}: {p['marker_error']}" for k, p in sorted(probes.items()) if p.get("marker_error")]
    if errors:
        return Result(
            "checkpoint",
            FAIL,
            f"{directory} is not writable from {len(errors)} node(s)",
            errors,
            f"create {directory} on the shared storage with write permission for the user Ray runs as "
            "(the Docker image runs as uid 1000 'stapo' unless started with --user)",
        )
    everyone = set(probes)
    blind = {k: sorted(everyone - set(v)) for k, v in seen.items() if not everyone <= set(v)}
    details = [f"{labels.get(k, k)} sees {len(v)}/{len(everyone)} markers" for k, v in sorted(seen.items())]
    if blind:
        lines = [
            f"{labels.get(k, k)} does not see the files of " + ", ".join(labels.get(m, m) for m in missing)
            for k, missing in sorted(blind.items())
        ]
        return Result(
            "checkpoint",
            FAIL,
            f"{directory} is not shared: files written on one node are missing on others",
            lines + details,
            "mount the same shared file system at the same path on every node (and in every container), and "
            "point trainer.default_local_dir at it; node-local disks lose the other ranks' shards on resume",
        )
    return Result("checkpoint", OK, f"{directory} is writable and shared by all {len(everyone)} node(s)", details)


def check_plugin(results: dict[str, dict[str, Any]], labels: dict[str, str]) -> Result:
    bad = {k: r for k, r in results.items() if not r["ok"]}
    details = [f"{labels.get(k, k)}: {r['detail']}" for k, r in sorted(results.items())]
    if bad:
        return Result(
            "plugin",
            FAIL,
            f"get_policy_loss_fn('stapo') fails in a Ray worker on {len(bad)} of {len(results)} node(s)",
            details,
            "install this package in the environment Ray runs on every node (the image does; on bare nodes "
            "`pip install -e .` before `ray start`), keep VERL_USE_EXTERNAL_PLUGINS unset or 'auto', and make sure "
            "no stale stapo*.egg-info or 'stapo' folder shadows it; `python -c \"import stapo.verl_plugin.entry\"` "
            "on that node shows the import error verl hides",
        )
    return Result("plugin", OK, f"STAPO's policy loss is registered in Ray workers on {len(results)} node(s)", details)


def _ifname_matches(spec: str, interfaces: list[str]) -> bool:
    """NCCL's syntax: comma list, leading ^ excludes, leading = means exact names, else prefixes."""
    if spec.startswith("^") or not interfaces:
        return True
    exact = spec.startswith("=")
    names = [s for s in spec.lstrip("=").split(",") if s]
    return any((i == n) if exact else i.startswith(n) for n in names for i in interfaces)


def check_network(probes: dict[str, dict[str, Any]], labels: dict[str, str]) -> Result:
    problems, details, values = [], [], {}
    for node_id, probe in sorted(probes.items()):
        env, label = probe["env"], labels.get(node_id, node_id)
        for var in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
            values.setdefault(var, set()).add(env.get(var))
            if env.get(var) and not _ifname_matches(env[var], probe["interfaces"]):
                problems.append(f"{label}: {var}={env[var]} matches none of {', '.join(probe['interfaces'])}")
        shown = ", ".join(f"{k}={env.get(k)}" for k in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"))
        details.append(f"{label}: {shown}; interfaces {', '.join(probe['interfaces'])}")
    if problems:
        return Result(
            "network",
            FAIL,
            "a socket interface setting names no interface of its node (NCCL/gloo would fail or hang at start-up)",
            problems + details,
            "export NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME with the node's cluster interface before "
            "start_head.sh / start_worker.sh (see launch/README.md)",
        )
    mixed = [var for var, vals in values.items() if len(vals) > 1]
    if mixed:
        return Result(
            "network",
            WARN,
            f"{', '.join(mixed)} differ between nodes",
            details,
            "fine when the nodes' interface names differ; otherwise set them the same way everywhere",
        )
    return Result("network", OK, "socket interface settings are consistent", details)


# ----------------------------------------------------------------------------- cluster side


def _ensure_auth_env() -> None:
    """Recent Ray clusters use token authentication; a driver needs RAY_AUTH_MODE=token to send it."""
    if os.environ.get("RAY_AUTH_MODE"):
        return
    token_path = os.environ.get("RAY_AUTH_TOKEN_PATH") or str(Path.home() / ".ray" / "auth_token")
    if os.environ.get("RAY_AUTH_TOKEN") or (os.path.isfile(token_path) and os.path.getsize(token_path) > 0):
        os.environ["RAY_AUTH_MODE"] = "token"


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


def run_checks(args: argparse.Namespace, plan: dict[str, Any]) -> tuple[list[Node], list[Result]]:
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
            read_refs = {
                k: _pinned(read_markers, k).remote(marker_root, writers, args.shared_wait) for k in probes
            }
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
    return nodes, results


# ----------------------------------------------------------------------------- command line


def _parse(argv: list[str]) -> tuple[argparse.Namespace, dict[str, Any]]:
    parser = argparse.ArgumentParser(
        prog="stapo doctor",
        description="Preflight checks of a Ray cluster before a multi-node STAPO run. Pass the same "
        "trainer.* overrides as the job (other overrides are accepted and ignored).",
    )
    parser.add_argument("overrides", nargs="*", help="job overrides: trainer.nnodes=N trainer.n_gpus_per_node=G "
                        "trainer.default_local_dir=/shared/ckpt")
    parser.add_argument("--address", default=os.environ.get("RAY_ADDRESS", "auto"),
                        help="Ray GCS address host:port (default: $RAY_ADDRESS, else the local cluster)")
    parser.add_argument("--nnodes", type=int, help="nodes the job uses (default: trainer.nnodes, else 1)")
    parser.add_argument("--n-gpus-per-node", type=float,
                        help="accelerators per node (default: trainer.n_gpus_per_node, else 8)")
    parser.add_argument("--resource", default="GPU",
                        help="Ray resource the job's workers ask for (default GPU; the CPU back-end's slots are "
                        "also 'GPU')")
    parser.add_argument("--checkpoint-dir", help="directory that must be shared (default: "
                        "trainer.default_local_dir, else $STAPO_CHECKPOINT_DIR)")
    parser.add_argument("--runtime-env", help="runtime env YAML to run the probes under (e.g. the job's)")
    parser.add_argument("--working-dir", help="working directory to upload for the probes, as the job does")
    parser.add_argument("--skip", default="", help=f"comma list of checks to skip: {','.join(CHECK_NAMES)}")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds for each phase of the probes")
    parser.add_argument("--connect-timeout", type=float, default=90.0, help="seconds to join the cluster")
    parser.add_argument("--shared-wait", type=float, default=10.0,
                        help="seconds a node waits to see the others' marker files (NFS caches listings)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("-v", "--verbose", action="store_true", help="per-node details of passing checks too")
    args = parser.parse_args(argv)

    args.skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    unknown = args.skip - set(CHECK_NAMES)
    if unknown:
        parser.error(f"--skip: unknown check(s) {sorted(unknown)}; known: {', '.join(CHECK_NAMES)}")
    if args.address.startswith(("http://", "https://")):
        parser.error(
            f"--address/RAY_ADDRESS={args.address} is the dashboard (job API) address; the doctor joins the "
            "cluster as a driver and needs the GCS address, <head>:6379 (RAY_HEAD_PORT). Or run it as a job: "
            f"ray job submit --address {args.address} -- stapo doctor ..."
        )
    values: dict[str, str] = {}
    ignored = []
    for item in args.overrides:
        key, sep, value = item.lstrip("+").partition("=")
        if not sep:
            parser.error(f"{item!r} is not a key=value override")
        if key in ("trainer.nnodes", "trainer.n_gpus_per_node", "trainer.default_local_dir"):
            values[key] = value
        else:
            ignored.append(key)
    try:
        nnodes = args.nnodes if args.nnodes is not None else int(values.get("trainer.nnodes", 1))
        per_node = (
            args.n_gpus_per_node if args.n_gpus_per_node is not None else float(values.get("trainer.n_gpus_per_node", 8))
        )
    except ValueError as error:
        parser.error(f"trainer.nnodes / trainer.n_gpus_per_node must be numbers: {error}")
    if nnodes < 1 or per_node <= 0:
        parser.error("trainer.nnodes must be >= 1 and trainer.n_gpus_per_node > 0")
    directory = args.checkpoint_dir or values.get("trainer.default_local_dir") or os.environ.get("STAPO_CHECKPOINT_DIR")
    if directory in ("", "null", "None"):
        directory = None
    plan = {"nnodes": nnodes, "per_node": per_node, "checkpoint_dir": directory, "ignored": ignored}
    return args, plan


def _runtime_env(args: argparse.Namespace) -> dict[str, Any] | None:
    env: dict[str, Any] = {}
    if args.runtime_env:
        import yaml

        env = yaml.safe_load(Path(args.runtime_env).read_text()) or {}
    if args.working_dir:
        env["working_dir"] = args.working_dir
    return env or None


def _print_report(address: str, plan: dict[str, Any], args: argparse.Namespace, nodes: list[Node], results: list[Result]) -> None:
    import ray

    print(f"STAPO doctor: Ray {ray.__version__} cluster at {address}, {len(nodes)} alive node(s)")
    print(
        f"job shape: trainer.nnodes={plan['nnodes']} x trainer.n_gpus_per_node={plan['per_node']:g} of "
        f"'{args.resource}'; checkpoint dir: {plan['checkpoint_dir'] or '(none)'}"
    )
    if plan["ignored"]:
        print(f"(overrides not used by the checks: {', '.join(plan['ignored'])})")
    for node in nodes:
        res = ", ".join(
            f"{k} {node.available.get(k, 0):g}/{v:g} free" for k, v in sorted(node.total.items())
            if k in ("CPU", "GPU", args.resource)
        )
        print(f"  {node.label}: {res}")
    print()
    width = max(len(r.name) for r in results) if results else 8
    for result in results:
        print(f"[{result.status:^4}] {result.name:<{width}}  {result.summary}")
        if result.status in (FAIL, WARN) or args.verbose:
            for line in result.details:
                print(f"       {'':<{width}}  {line}")
            if result.fix and result.status in (FAIL, WARN):
                print(f"       {'':<{width}}  fix: {result.fix}")
    failed = [r.name for r in results if r.status == FAIL]
    warned = [r.name for r in results if r.status == WARN]
    print()
    if failed:
        print(f"FAILED: {', '.join(failed)}" + (f" (warnings: {', '.join(warned)})" if warned else ""))
    else:
        print("all checks passed" + (f" (warnings: {', '.join(warned)})" if warned else ""))


def _gcs_reachable(address: str, timeout: float) -> str | None:
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


def _connect_watchdog(address: str, timeout: float):
    """ray.init can block for minutes on a half-alive cluster: give up after ``timeout`` seconds."""
    import threading

    def expire() -> None:
        print(
            f"stapo doctor: error: joining the Ray cluster at {address!r} took more than {timeout:g}s\n"
            f"fix: {_CONNECT_FIX}",
            file=sys.stderr,
            flush=True,
        )
        os._exit(2)

    timer = threading.Timer(timeout, expire)
    timer.daemon = True
    timer.start()
    return timer


_CONNECT_FIX = (
    "start it (launch/ray/start_head.sh) and pass --address <head>:<GCS port> or set RAY_ADDRESS; run the "
    "doctor on a node of the cluster (or submit it as a Ray job); with token authentication the head's "
    "~/.ray/auth_token (or RAY_AUTH_TOKEN) must be available here"
)


def main(argv: list[str]) -> int:
    args, plan = _parse(list(argv))
    _ensure_auth_env()
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    unreachable = _gcs_reachable(args.address, timeout=min(10.0, args.connect_timeout))
    if unreachable:
        print(
            f"stapo doctor: error: nothing answers at {args.address!r} ({unreachable})\nfix: {_CONNECT_FIX}",
            file=sys.stderr,
        )
        return 2
    import ray

    watchdog = _connect_watchdog(args.address, args.connect_timeout)
    try:
        ray.init(
            address=args.address,
            namespace="stapo-doctor",
            runtime_env=_runtime_env(args),
            log_to_driver=False,
            logging_level="ERROR",
        )
    except Exception as error:  # noqa: BLE001 - any failure to join is the user's to fix
        print(
            f"stapo doctor: error: cannot join the Ray cluster at {args.address!r}: {type(error).__name__}: "
            f"{str(error)[:800]}\nfix: {_CONNECT_FIX}",
            file=sys.stderr,
        )
        return 2
    finally:
        watchdog.cancel()
    try:
        address = ray.get_runtime_context().gcs_address
        nodes, results = run_checks(args, plan)
    finally:
        ray.shutdown()
    if args.json:
        print(json.dumps({"address": address, "plan": plan, "nodes": [asdict(n) for n in nodes],
                          "results": [asdict(r) for r in results]}, indent=2))
    else:
        _print_report(address, plan, args, nodes, results)
    return 1 if any(r.status == FAIL for r in results) else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
