"""`stapo eval CHECKPOINT`: avg@N on the paper's benchmarks, both decoding settings."""

from __future__ import annotations

import argparse
from pathlib import Path

from stapo.eval.core import DECODING, MAX_TOKENS, PAPER_N, evaluate


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="stapo eval", description=__doc__)
    parser.add_argument("checkpoint", help="an HF checkpoint folder or hub id")
    parser.add_argument("--data-root", type=Path, default=Path.home() / "data" / "stapo",
                        help="where `stapo data prepare` wrote <name>/test.parquet (default ~/data/stapo)")
    parser.add_argument("--benchmarks", default=",".join(PAPER_N), help="comma-separated (default: the six)")
    parser.add_argument("--decoding", default=",".join(DECODING), help=f"comma-separated of {list(DECODING)}")
    parser.add_argument("--n", type=int, help="samples per prompt (default: the paper's N per benchmark)")
    parser.add_argument("--max-tokens", type=int, default=MAX_TOKENS)
    parser.add_argument("--limit", type=int, help="first N prompts of each benchmark (quick checks)")
    parser.add_argument("--backend", default="auto", choices=["auto", "hf", "vllm"])
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    parser.add_argument("--math-verify", action="store_true", help="math-verify second opinion on strict misses")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("eval_results"))
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    settings = tuple(s.strip() for s in args.decoding.split(",") if s.strip())
    unknown = [s for s in settings if s not in DECODING]
    if unknown:
        print(f"stapo eval: error: --decoding {unknown} unknown; choose from {list(DECODING)}")
        return 2
    benchmarks = {}
    for name in (b.strip() for b in args.benchmarks.split(",") if b.strip()):
        path = args.data_root / name / "test.parquet"
        if not path.exists():
            print(f"stapo eval: error: {path} is missing; run `stapo data prepare {name}` first")
            return 2
        benchmarks[name] = path
    if args.n is not None and args.n < 1 or args.max_tokens < 1:
        print("stapo eval: error: --n and --max-tokens must be >= 1")
        return 2
    from stapo.eval.backends import make_generator

    kwargs = {"tensor_parallel_size": args.tensor_parallel_size} if args.backend == "vllm" else {}
    generate = make_generator(args.backend, args.checkpoint, **kwargs)
    evaluate(generate, benchmarks, args.out, settings, args.n, args.max_tokens, args.limit, args.seed, args.math_verify)
    print((args.out / "results.md").read_text())
    return 0
