"""``python -m benchmarks.run [--quick] [--only NAME[,NAME...]] [--device D] [--threads N]``

Runs the registered benchmarks and writes their sections of BENCHMARKS.md. Each benchmark is a
module that measures and renders its own section: ``NAME``, ``TITLE``, ``SIZES`` (``quick`` and
``full`` keyword sets), ``measure(device, **size) -> rows`` and ``render(rows) -> markdown``. This
runner only chooses, times, stamps each section with the command and the machine, and replaces
that section in the file; everything else in BENCHMARKS.md is written by hand and kept.
``--quick`` runs tiny sizes and writes nothing unless ``--write``.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import re
import shlex
import sys
import time
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "BENCHMARKS.md"
# name: module; imported only when chosen (a benchmark's imports never stop another from running)
REGISTRY = {
    "loss": "benchmarks.loss_path",
    "mask": "benchmarks.mask_build",
    "tq": "benchmarks.tq_roundtrip",
    "quantile": "benchmarks.dp_quantile",
    "entropy": "benchmarks.entropy",
    "e2e": "benchmarks.e2e_step",
    "rollout": "benchmarks.rollout_group",
    "valboot": "benchmarks.val_bootstrap",
    "hops": "benchmarks.agent_loop_hops",
    "draw": "benchmarks.sampler_draw",
}
NAMES = tuple(REGISTRY)
NOTES_MARK = "<!-- notes: written by hand below this line -->"


def benchmark(name: str) -> ModuleType:
    module = importlib.import_module(REGISTRY[name])
    assert module.NAME == name, f"{REGISTRY[name]}.NAME is {module.NAME!r}, registered as {name!r}"
    return module


def section(name: str, title: str, body: str, header: str) -> str:
    return f"<!-- bench:{name} -->\n## {title}\n\n{header}\n\n{body}\n<!-- /bench:{name} -->"


def update_doc(sections: dict[str, str], doc: Path = DOC) -> None:
    """Replace each named section in place; a section not in the file yet goes above the notes mark."""
    text = doc.read_text() if doc.exists() else f"# Benchmarks\n\n{NOTES_MARK}\n"
    if NOTES_MARK not in text:
        text = text.rstrip("\n") + f"\n\n{NOTES_MARK}\n"
    for name, new in sections.items():
        pattern = re.compile(rf"<!-- bench:{name} -->.*?<!-- /bench:{name} -->", re.S)
        if pattern.search(text):
            text = pattern.sub(lambda _: new, text)
        else:
            text = text.replace(NOTES_MARK, new + "\n\n" + NOTES_MARK)
    doc.write_text(text)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny sizes (seconds); writes nothing unless --write")
    parser.add_argument("--only", default="", help=f"comma-separated subset of {','.join(NAMES)}")
    parser.add_argument("--skip", default="", help="comma-separated benchmarks to leave out")
    parser.add_argument("--device", default="auto", help="auto (cuda if available), cpu or cuda[:N]")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1: see BENCHMARKS.md)")
    parser.add_argument("--write", action="store_true", help="update BENCHMARKS.md even with --quick")
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--json", type=Path, help="also dump every row as JSON to this file")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    chosen = [n.strip() for n in args.only.split(",") if n.strip()] or list(NAMES)
    skip = {n.strip() for n in args.skip.split(",") if n.strip()}
    unknown = [n for n in [*chosen, *skip] if n not in REGISTRY]
    if unknown:
        parser.error(f"unknown benchmark(s) {unknown}; choose from {', '.join(NAMES)}")
    if args.threads < 1:
        parser.error(f"--threads must be >= 1, got {args.threads}")
    import torch

    from benchmarks.common import load_average, machine_info, pick_device

    torch.set_num_threads(args.threads)
    device = pick_device(args.device)
    info = machine_info(device)
    command = "python -m benchmarks.run" + ("" if not argv else " " + " ".join(shlex.quote(a) for a in argv))
    sections, dump = {}, {}
    for name in [n for n in chosen if n not in skip]:
        bench = benchmark(name)
        load_before, started = load_average(), time.perf_counter()
        print(f"== {bench.TITLE} ...", file=sys.stderr, flush=True)
        rows = bench.measure(device, **bench.SIZES["quick" if args.quick else "full"])
        body = bench.render(rows)
        header = (
            f"Run: `{command}` on {datetime.date.today().isoformat()}, {time.perf_counter() - started:.0f} s. "
            f"Machine: {info['cpu']}, {info['cores']} cores, torch {info['torch']} ({args.threads} thread"
            f"{'s' if args.threads > 1 else ''}), device {info['device']}, GPU: {info['gpu']}. "
            f"Load average before / after: {load_before} / {load_average()}."
        )
        # a GPU run gets sections of its own (``mask@cuda``) beside the CPU figures instead of replacing them
        key, title = name, bench.TITLE
        if device.type != "cpu":
            key, title = f"{name}@{device.type}", f"{title} ({device.type})"
        print(f"\n## {title}\n\n{header}\n\n{body}\n", flush=True)
        sections[key] = section(key, title, body, header)
        dump[name] = rows
    if args.json:
        args.json.write_text(json.dumps(dump, indent=1, default=str))
    if (args.write or not args.quick) and not args.no_write:
        update_doc(sections)
        print(f"updated {DOC.relative_to(ROOT)}: {', '.join(sections)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
