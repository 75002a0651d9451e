"""`stapo doctor` command line: parse the job's overrides, run the probes or the smoke job, print.

Exit status: 0 when nothing failed (warnings allowed), 1 when a check (or the smoke job) failed,
2 on bad usage or when the cluster cannot be reached.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from stapo.doctor.checks import CHECK_NAMES, FAIL, WARN, Node, Result, check_smoke
from stapo.doctor.probes import CONNECT_FIX, connect_watchdog, ensure_auth_env, examine_cluster, gcs_reachable

_SHAPE_KEYS = ("trainer.nnodes", "trainer.n_gpus_per_node", "trainer.default_local_dir")


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stapo doctor",
        description="Preflight checks of a Ray cluster before a multi-node STAPO run. Pass the same "
        "trainer.* overrides as the job (other overrides are accepted and ignored). With --smoke: submit "
        "the GPU smoke preset (model_preset=qwen3_0p6b_smoke algo=stapo, 2 steps) as a Ray job and report "
        "whether it passed; the overrides then go to that job.",
    )
    parser.add_argument(
        "overrides",
        nargs="*",
        help="job overrides: trainer.nnodes=N trainer.n_gpus_per_node=G trainer.default_local_dir=/shared/ckpt",
    )
    parser.add_argument(
        "--address",
        default=os.environ.get("RAY_ADDRESS", "auto"),
        help="Ray GCS address host:port (default: $RAY_ADDRESS, else the local cluster); with "
        "--smoke also the job API, http://<head>:8265",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="submit the GPU smoke run (vLLM rollout, FSDP on CUDA, STAPO, 2 steps) and report "
        "pass/fail with the first error line of its log",
    )
    parser.add_argument(
        "--no-check",
        action="store_true",
        help="do not check the job's config here first (given more than trainer.* overrides, the doctor runs the "
        "recipe's checks on them before probing; with --smoke before submitting, else the job refuses a bad "
        "setting itself, after the cluster has started it)",
    )
    parser.add_argument(
        "--smoke-timeout",
        type=float,
        default=1800.0,
        help="seconds before the smoke job is stopped and reported as failed (default 1800)",
    )
    parser.add_argument("--nnodes", type=int, help="nodes the job uses (default: trainer.nnodes, else 1)")
    parser.add_argument(
        "--n-gpus-per-node", type=float, help="accelerators per node (default: trainer.n_gpus_per_node, else 8)"
    )
    parser.add_argument(
        "--resource",
        default="GPU",
        help="Ray resource the job's workers ask for (default GPU; the CPU back-end's slots are also 'GPU')",
    )
    parser.add_argument(
        "--checkpoint-dir",
        help="directory that must be shared (default: trainer.default_local_dir, else $STAPO_CHECKPOINT_DIR)",
    )
    parser.add_argument("--runtime-env", help="runtime env YAML to run the probes under (e.g. the job's)")
    parser.add_argument("--working-dir", help="working directory to upload for the probes, as the job does")
    parser.add_argument("--skip", default="", help=f"comma list of checks to skip: {','.join(CHECK_NAMES)}")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds for each phase of the probes")
    parser.add_argument("--connect-timeout", type=float, default=90.0, help="seconds to join the cluster")
    parser.add_argument(
        "--shared-wait",
        type=float,
        default=10.0,
        help="seconds a node waits to see the others' marker files (NFS caches listings)",
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="per-node details of passing checks too; with --smoke the whole job log",
    )
    return parser


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, dict[str, Any]]:
    """Arguments and the job's shape (``plan``) as the checks need it."""
    parser = _build_parser()
    args = parser.parse_args(argv)

    args.skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    unknown = args.skip - set(CHECK_NAMES)
    if unknown:
        parser.error(f"--skip: unknown check(s) {sorted(unknown)}; known: {', '.join(CHECK_NAMES)}")
    if args.smoke and args.smoke_timeout <= 0:
        parser.error(f"--smoke-timeout must be > 0 seconds, got {args.smoke_timeout:g}")
    if args.address.startswith(("http://", "https://")) and not args.smoke:
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
        if key in _SHAPE_KEYS:
            values[key] = value
        else:
            ignored.append(key)
    try:
        nnodes = args.nnodes if args.nnodes is not None else int(values.get("trainer.nnodes", 1))
        per_node = args.n_gpus_per_node
        if per_node is None:
            per_node = float(values.get("trainer.n_gpus_per_node", 8))
        steps = [
            int(o.partition("=")[2])
            for o in args.overrides
            if o.lstrip("+").startswith("trainer.total_training_steps=")
        ]
    except ValueError as error:
        parser.error(
            f"trainer.nnodes, trainer.n_gpus_per_node and trainer.total_training_steps must be numbers: {error}"
        )
    for flag, seconds in (("--timeout", args.timeout), ("--connect-timeout", args.connect_timeout)):
        if not seconds > 0:  # a negative limit would end every wait at once, reported as a timeout
            parser.error(f"{flag}={seconds:g}: must be a number of seconds > 0")
    if not args.shared_wait >= 0:
        parser.error(f"--shared-wait={args.shared_wait:g}: must be a number of seconds >= 0")
    if nnodes < 1 or per_node <= 0:
        parser.error("trainer.nnodes must be >= 1 and trainer.n_gpus_per_node > 0")
    if any(s < 1 for s in steps):
        parser.error("trainer.total_training_steps must be >= 1 for the smoke run")
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


def _print_results(results: list[Result], verbose: bool) -> None:
    width = max(len(r.name) for r in results) if results else 8
    for result in results:
        print(f"[{result.status:^4}] {result.name:<{width}}  {result.summary}")
        if result.status in (FAIL, WARN) or verbose:
            for line in result.details:
                print(f"       {'':<{width}}  {line}")
            if result.fix and result.status in (FAIL, WARN):
                print(f"       {'':<{width}}  fix: {result.fix}")
    failed = [r.name for r in results if r.status == FAIL]
    warned = [r.name for r in results if r.status == WARN]
    warnings = f" (warnings: {', '.join(warned)})" if warned else ""
    print()
    print(f"FAILED: {', '.join(failed)}{warnings}" if failed else f"all checks passed{warnings}")


def _print_report(
    address: str, plan: dict[str, Any], args: argparse.Namespace, nodes: list[Node], results: list[Result]
) -> None:
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
            f"{k} {node.available.get(k, 0):g}/{v:g} free"
            for k, v in sorted(node.total.items())
            if k in ("CPU", "GPU", args.resource)
        )
        print(f"  {node.label}: {res}")
    print()
    _print_results(results, args.verbose)


def config_refusal(overrides: list[str]) -> str | None:
    """The recipe's one-line refusal of a job's config, checked here before anything is probed or submitted
    (the paths are the cluster's: they are checked by the job)."""
    from stapo.algorithm.validation import STAPOConfigError, refusal_line
    from stapo.check import check_run, compose_run

    try:
        check_run(compose_run(overrides), paths=False)
    except STAPOConfigError as error:
        return refusal_line(error)
    return None


def _smoke(args: argparse.Namespace) -> int:
    from stapo.doctor.smoke import job_address, run_smoke, smoke_overrides, total_steps

    overrides = smoke_overrides(args.overrides)
    # The address first: a socket connect answers in milliseconds, the config check imports torch and verl.
    api = job_address(args.address)
    unreachable = gcs_reachable(api.split("://", 1)[1], timeout=10.0)
    if unreachable:
        print(
            f"stapo doctor: error: no Ray job API answers at {api} ({unreachable})\nfix: start the head with "
            "launch/ray/start_head.sh (dashboard on) and pass --address <head>:6379 or http://<head>:8265",
            file=sys.stderr,
        )
        return 2
    if not args.no_check:
        refusal = config_refusal(overrides)
        if refusal:
            print(refusal, file=sys.stderr)
            return 2
    print(f"STAPO doctor smoke run: {' '.join(overrides)} -> {api}", file=sys.stderr, flush=True)
    try:
        run = run_smoke(args.address, overrides, args.smoke_timeout, echo=args.verbose)
    except FileNotFoundError as error:
        print(f"stapo doctor: error: {error}", file=sys.stderr)
        return 2
    result = check_smoke(
        run.job_id,
        run.succeeded,
        run.seconds,
        run.log,
        total_steps(overrides),
        run.log_path,
        args.smoke_timeout if run.timed_out else None,
    )
    if args.json:
        print(json.dumps({"job_address": api, "overrides": overrides, "results": [asdict(result)]}, indent=2))
    else:
        _print_results([result], verbose=True)
    return 1 if result.status == FAIL else 0


def main(argv: list[str]) -> int:
    args, plan = parse_args(list(argv))
    ensure_auth_env()
    if args.smoke:
        return _smoke(args)
    if plan["ignored"] and not args.no_check:
        # the job's own overrides came with the shape: the recipe's refusal now, not after the probes
        refusal = config_refusal(args.overrides)
        if refusal:
            print(refusal, file=sys.stderr)
            return 2
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    unreachable = gcs_reachable(args.address, timeout=min(10.0, args.connect_timeout))
    if unreachable:
        print(
            f"stapo doctor: error: nothing answers at {args.address!r} ({unreachable})\nfix: {CONNECT_FIX}",
            file=sys.stderr,
        )
        return 2
    import ray

    watchdog = connect_watchdog(args.address, args.connect_timeout)
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
            f"{str(error)[:800]}\nfix: {CONNECT_FIX}",
            file=sys.stderr,
        )
        return 2
    finally:
        watchdog.cancel()
    try:
        address = ray.get_runtime_context().gcs_address
        nodes, results = examine_cluster(args, plan)
    finally:
        ray.shutdown()
    if args.json:
        print(
            json.dumps(
                {
                    "address": address,
                    "plan": plan,
                    "nodes": [asdict(n) for n in nodes],
                    "results": [asdict(r) for r in results],
                },
                indent=2,
            )
        )
    else:
        _print_report(address, plan, args, nodes, results)
    return 1 if any(r.status == FAIL for r in results) else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
