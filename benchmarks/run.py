"""``python -m benchmarks.run [--quick] [--write]``: STAPO's cost against verl's own code path.

Prints a table; with ``--write`` replaces BENCHMARKS.md with the figures, the command and the machine.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys
from pathlib import Path

import torch

from benchmarks import loss_path, mask_build

ROOT = Path(__file__).resolve().parents[1]
NOTES = """
## Reading the figures

- `stapo/old` is verl's vanilla objective over the mask the trainer folded in: the same work as
  `vanilla`, so its ratio is 1 within the noise of this machine. No tensor of vocabulary size is
  created anywhere in the STAPO path: the loss and the mask see per-token tensors only
  (log-probs, entropies, advantages, masks), which is what the shapes in `stapo/s2t.py` say.
- `stapo/current` adds detection and its diagnostics to every micro-batch (exp, compares, a few
  exact quantiles, host syncs): about twice the cost of the loss function itself, a few ms per
  32k tokens on this CPU, against seconds of model forward and backward for the same tokens.
  Prefer `source: old` unless you need the paper-literal current-policy detection.
- Mask building for `source: old` runs once per step on the driver; at the paper's batch size it is
  about 1e-4 of the old-log-prob pass verl runs anyway (estimated from a 135M model on this CPU, so
  a generous upper bound of the ratio for the paper's 1.7B-14B models).
- Not measured yet: the entropy cost of `source: current` at vocabulary 151,936 (verl's plain and
  chunked entropy), and GPU figures (no GPU was available to the session that wrote this file).
"""


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU (CPU figures)"
    return f"{cpu}, {torch.get_num_threads()} threads, torch {torch.__version__}, Python {platform.python_version()}, {gpu}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes (seconds), for smoke tests")
    parser.add_argument("--write", action="store_true", help="rewrite BENCHMARKS.md with these figures")
    parser.add_argument("--e2e", action="store_true", help="also time the real tiny CPU trainer (about 10 min)")
    args = parser.parse_args(argv)

    lines = []
    rows, tokens = (2, 256) if args.quick else (8, 4096)
    loss_rows = loss_path.run(rows=rows, tokens=tokens, repeats=3 if args.quick else 7)
    lines += ["## Loss path: verl's ppo_loss, forward + backward of one micro-batch", "",
              "| case | variant | median ms | ratio vs vanilla | spread |", "|---|---|---|---|---|"]
    lines += [f"| {r['case']} | {r['variant']} | {r['median_ms']:.2f} | {r['ratio_vs_vanilla']:.3f} | "
              f"{r['spread']:.2f} |" for r in loss_rows]

    responses, max_len = (16, 512) if args.quick else (2048, 15360)
    mask = mask_build.time_mask(responses, max_len, repeats=1 if args.quick else 3)
    model = None
    try:
        from stapo.models.smollm2 import smollm2_path

        model = smollm2_path()
    except FileNotFoundError:
        pass
    per_token = mask_build.forward_seconds_per_token(model, 256 if args.quick else 2048) if model else float("nan")
    old_pass = per_token * mask["tokens"]
    lines += ["", "## Mask building for source=old on one whole batch (driver, once per step)", "",
              "| responses x max len | response tokens | candidates | mask + diagnostics s | peak RSS delta GiB |"
              " old-log-prob pass s (SmolLM2-135M, lower bound) | ratio |", "|---|---|---|---|---|---|---|",
              f"| {responses} x {max_len} | {mask['tokens']:,} | {mask['candidates']:,} | {mask['seconds']:.2f} | "
              f"{mask['peak_rss_delta_bytes'] / 2**30:.2f} | {old_pass:.0f} | {mask['seconds'] / old_pass:.5f} |"]

    per_rank = 2_000 if args.quick else 300_000
    lines += ["", "## DP-global quantile over gloo (candidates gathered, exact)", "",
              "| ranks | candidates per rank | global ms | local ms |", "|---|---|---|---|"]
    for world in (2,) if args.quick else (2, 3, 4):
        q = mask_build.time_dp_quantile(world, per_rank)
        lines.append(f"| {world} | {per_rank:,} | {1000 * q['global_seconds']:.1f} | {1000 * q['local_seconds']:.1f} |")

    if not args.e2e:
        lines += ["", "(End-to-end seconds per step not measured in this run: add `--e2e`.)"]
    if args.e2e:
        from benchmarks import e2e_step

        e2e = e2e_step.run()
        lines += ["", "## End to end: seconds per step of the tiny CPU trainer (steps 2-4, 3 runs each)", "",
                  "| algo=stapo s/step | algo=justrl s/step | ratio | samples stapo | samples justrl |",
                  "|---|---|---|---|---|",
                  f"| {e2e['stapo_s']:.2f} | {e2e['justrl_s']:.2f} | {e2e['ratio']:.3f} | "
                  f"{', '.join(f'{x:.2f}' for x in e2e['samples']['stapo'])} | "
                  f"{', '.join(f'{x:.2f}' for x in e2e['samples']['justrl'])} |"]

    report = "\n".join(lines)
    print(report)
    if args.write:
        command = "python -m benchmarks.run " + " ".join(a for a in (argv if argv is not None else sys.argv[1:]))
        header = [
            "# Benchmarks", "",
            f"Command: `{command.strip()}`  ", f"Machine: {machine()}  ",
            f"Date: {datetime.date.today().isoformat()}", "",
            "Every figure is measured in the same run as its yardstick (verl's own code path). "
            "Timings on this shared 2-core machine are noisy: see the spread column (max - min over median).",
            "",
        ]
        (ROOT / "BENCHMARKS.md").write_text("\n".join(header) + report + "\n" + NOTES)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
