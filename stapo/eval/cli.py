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
    parser.add_argument("--max-tokens", type=int, default=MAX_TOKENS,
                        help=f"response length limit in tokens (default {MAX_TOKENS})")
    parser.add_argument("--limit", type=int, help="first N prompts of each benchmark (quick checks)")
    parser.add_argument("--backend", default="auto", choices=["auto", "hf", "vllm"],
                        help="generation back-end (default auto: vLLM on a GPU, "
                        "HF generate on a CPU)")
    parser.add_argument("--tensor-parallel-size", type=int, default=1, help="vLLM only")
    parser.add_argument("--batch-size", type=int, default=16, help="HF only: sequences generated at once")
    parser.add_argument("--threads", type=int, help="HF only: torch CPU threads (1 is fastest on a busy machine)")
    parser.add_argument("--math-verify", action="store_true", help="math-verify second opinion on strict misses")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    parser.add_argument("--out", type=Path, default=Path("eval_results"),
                        help="folder for the per-benchmark results and summary (default eval_results)")
    return parser


def main(argv: list[str]) -> int:
    from stapo.input_checks import check_model_path
    from stapo.algorithm.validation import STAPOConfigError

    args = build_parser().parse_args(argv)
    if args.limit is not None and args.limit < 1:
        raise STAPOConfigError(f"--limit={args.limit}: must be >= 1 (prompts per benchmark)")
    # a missing or non-HF folder otherwise fails inside transformers with a 40-line traceback
    check_model_path(args.checkpoint, key="checkpoint")
    if args.checkpoint.startswith("stapo://"):
        from stapo.models.local import resolve_model_path

        args.checkpoint = resolve_model_path(args.checkpoint)
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

    if args.batch_size < 1 or args.tensor_parallel_size < 1:
        print("stapo eval: error: --batch-size and --tensor-parallel-size must be >= 1")
        return 2
    if args.threads is not None:
        import torch

        torch.set_num_threads(max(1, args.threads))
    kwargs = {"batch_size": args.batch_size}
    if args.backend != "hf":  # room for a prompt (the recipe's 1k) plus the generation limit
        kwargs.update(tensor_parallel_size=args.tensor_parallel_size, max_model_len=args.max_tokens + 2048)
    generate = make_generator(args.backend, args.checkpoint, **kwargs)
    evaluate(generate, benchmarks, args.out, settings, args.n, args.max_tokens, args.limit, args.seed, args.math_verify)
    print((args.out / "results.md").read_text())
    return 0
