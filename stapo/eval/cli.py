"""`stapo eval CHECKPOINT`: avg@N on the paper's benchmarks, both decoding settings; with --test-file, on your
own prepared test file scored by your reward (stapo/eval/own.py)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from stapo.eval.core import DECODING, MAX_TOKENS, PAPER_N, evaluate
from stapo.eval.own import DEFAULT_N, DEFAULT_REWARD_NAME


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="stapo eval", description=__doc__)
    parser.add_argument("checkpoint", help="an HF checkpoint folder or hub id")
    parser.add_argument("--data-root", type=Path,
                        help="where `stapo data prepare` wrote <name>/test.parquet (default ~/data/stapo)")
    parser.add_argument("--benchmarks", help="comma-separated (default: the six)")
    parser.add_argument("--test-file", help="your own test file (.parquet/.jsonl/.json in verl's row format, as "
                        "`stapo data prepare custom --split test` writes it) instead of the paper's benchmarks")
    parser.add_argument("--reward-file", help="with --test-file: your reward, a .py file or pkg://module "
                        "(verl's reward.custom_reward_function.path; default: verl's default_compute_score "
                        "by data_source, as a training run without one)")
    parser.add_argument("--reward-name", help="the function in --reward-file (verl's "
                        f"reward.custom_reward_function.name; default {DEFAULT_REWARD_NAME})")
    parser.add_argument("--reward-kwargs", help="with --reward-file: a JSON object of keywords added to every call "
                        "(verl's reward.custom_reward_function.reward_kwargs), e.g. '{\"format_score\": 0.1}'")
    parser.add_argument("--decoding", default=",".join(DECODING), help=f"comma-separated of {list(DECODING)}")
    parser.add_argument("--n", type=int, help="samples per prompt (default: the paper's N per benchmark; "
                        f"{DEFAULT_N} with --test-file)")
    parser.add_argument("--max-tokens", type=int, default=MAX_TOKENS,
                        help=f"response length limit in tokens (default {MAX_TOKENS})")
    parser.add_argument("--limit", type=int, help="first N prompts of each benchmark or of --test-file (quick checks)")
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
    from stapo.algorithm.validation import STAPOConfigError
    from stapo.input_checks import check_model_path

    args = build_parser().parse_args(argv)
    if args.limit is not None and args.limit < 1:
        raise STAPOConfigError(f"--limit={args.limit}: must be >= 1 (prompts per benchmark)")
    # a missing or non-HF folder otherwise fails inside transformers with a 40-line traceback
    check_model_path(args.checkpoint, key="checkpoint")
    settings = tuple(s.strip() for s in args.decoding.split(",") if s.strip())
    unknown = [s for s in settings if s not in DECODING]
    if unknown:
        print(f"stapo eval: error: --decoding {unknown} unknown; choose from {list(DECODING)}")
        return 2
    if args.test_file is not None:
        return _own_test_file(args, settings)
    for flag, value in (("--reward-file", args.reward_file), ("--reward-name", args.reward_name),
                        ("--reward-kwargs", args.reward_kwargs)):
        if value is not None:
            raise STAPOConfigError(f"{flag}={value}: scores --test-file (the paper's benchmarks use the paper's "
                                   "reward, stapo.reward)")
    args.data_root = args.data_root or Path.home() / "data" / "stapo"
    benchmarks = {}
    for name in (b.strip() for b in (args.benchmarks or ",".join(PAPER_N)).split(",") if b.strip()):
        path = args.data_root / name / "test.parquet"
        if not path.exists():
            print(f"stapo eval: error: {path} is missing; run `stapo data prepare {name}` first")
            return 2
        benchmarks[name] = path
    if args.n is not None and args.n < 1 or args.max_tokens < 1:
        print("stapo eval: error: --n and --max-tokens must be >= 1")
        return 2
    if args.batch_size < 1 or args.tensor_parallel_size < 1:
        print("stapo eval: error: --batch-size and --tensor-parallel-size must be >= 1")
        return 2
    generate = _generator(args)
    evaluate(generate, benchmarks, args.out, settings, args.n, args.max_tokens, args.limit, args.seed, args.math_verify)
    print((args.out / "results.md").read_text())
    return 0


def _generator(args):
    """The back-end, loaded after every refusal (the model load is the slow part)."""
    from stapo.eval.backends import make_generator

    if args.checkpoint.startswith("stapo://"):  # built on first use: after the refusals too
        from stapo.models.local import resolve_model_path

        args.checkpoint = resolve_model_path(args.checkpoint)
    if args.threads is not None:
        import torch

        torch.set_num_threads(max(1, args.threads))
    kwargs = {"batch_size": args.batch_size}
    if args.backend != "hf":  # room for a prompt (the recipe's 1k) plus the generation limit
        kwargs.update(tensor_parallel_size=args.tensor_parallel_size, max_model_len=args.max_tokens + 2048)
    return make_generator(args.backend, args.checkpoint, **kwargs)


def _own_test_file(args, settings: tuple[str, ...]) -> int:
    """--test-file: the file's rows, the reward and its call on the first row of each data source are checked,
    each refused in one line, before the model loads."""
    from stapo.algorithm.validation import STAPOConfigError
    from stapo.eval.own import check_reward_on_rows, evaluate_file, load_reward, load_test_file

    given = {"--benchmarks": args.benchmarks, "--data-root": args.data_root, "--math-verify": args.math_verify or None}
    for flag, value in given.items():
        if value is not None:
            raise STAPOConfigError(f"{flag}: the paper's benchmarks only; --test-file={args.test_file} is scored by "
                                   "--reward-file (a --math-verify second opinion belongs in your reward)"
                                   if flag == "--math-verify" else
                                   f"{flag}={value}: the paper's benchmarks; not with --test-file={args.test_file}")
    for flag, value in (("--n", args.n), ("--max-tokens", args.max_tokens), ("--batch-size", args.batch_size),
                        ("--tensor-parallel-size", args.tensor_parallel_size)):
        if value is not None and value < 1:
            raise STAPOConfigError(f"{flag}={value}: must be >= 1")
    problems = load_test_file(args.test_file, args.limit)
    reward = load_reward(args.reward_file, args.reward_name, _reward_kwargs(args.reward_kwargs))
    check_reward_on_rows(reward, problems, args.test_file)
    n = args.n if args.n is not None else DEFAULT_N
    print(f"[eval] {args.test_file}: {len(problems)} prompts, {n} samples each, {list(settings)}; reward "
          f"{reward.label}" + (f" ({reward.path})" if reward.path and reward.path != args.reward_file else ""),
          flush=True)
    generate = _generator(args)
    run = {"checkpoint": args.checkpoint, "test_file": args.test_file, "limit": args.limit, "backend": args.backend,
           "reward_kwargs": _reward_kwargs(args.reward_kwargs)}
    evaluate_file(generate, problems, reward, args.out, settings, n, args.max_tokens, args.seed, run)
    print((args.out / "results.md").read_text())
    return 0


def _reward_kwargs(text: str | None) -> dict:
    from stapo.algorithm.validation import STAPOConfigError

    if text is None:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise STAPOConfigError(f"--reward-kwargs={text}: not JSON ({error.msg}); give an object, e.g. "
                               "'{\"format_score\": 0.1}'") from None
    if not isinstance(value, dict):
        raise STAPOConfigError(f"--reward-kwargs={text}: must be a JSON object of keywords, got a "
                               f"{type(value).__name__}")
    return value
