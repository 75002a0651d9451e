"""``python -m benchmarks.run [--quick] [--only NAME[,NAME...]] [--device D] [--threads N]``

What STAPO costs on top of verl, each figure a ratio against verl's own code path measured in the
same run. Benchmarks (NAME): ``loss`` (verl's ppo_loss, vanilla vs STAPO old/current), ``mask``
(whole-batch S2T mask for source=old vs the old-log-prob pass), ``quantile`` (DP-global threshold
over 2/3/4 gloo ranks), ``entropy`` (entropy in the update forward at vocabulary 151,936), ``e2e``
(seconds per step of the real tiny CPU trainer, algo=stapo vs algo=justrl).

Prints the tables and, for a full-size run, replaces the matching sections of BENCHMARKS.md (the
other sections are kept). ``--quick`` runs tiny sizes and writes nothing unless ``--write``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import re
import shlex
import sys
import time
from pathlib import Path

import torch

from benchmarks.common import fmt_bytes, load_average, machine_info, pick_device

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "BENCHMARKS.md"
NAMES = ("loss", "mask", "quantile", "entropy", "e2e")
TITLES = {
    "loss": "1. Loss path: verl's `ppo_loss`, one micro-batch, forward + backward",
    "mask": "2a. Mask building for `source: old`, one whole batch of the paper's size",
    "quantile": "2b. DP-global quantile over gloo ranks",
    "entropy": "3. Entropy in the update forward (`source: current`) at vocabulary 151,936",
    "e2e": "4. End to end: seconds per step of the tiny CPU trainer",
}


def sizes(quick: bool) -> dict:
    if quick:
        return {
            "loss": dict(rows=2, tokens=256, prompt_len=32, repeats=5),
            "mask": dict(responses=32, max_len=1024, repeats=2),
            "old_pass": dict(tokens=64, repeats=1),
            "quantile": dict(worlds=(2,), per_rank=2000, micro_tokens=2048, repeats=5),
            "entropy": dict(tokens=64, chunk=16, repeats=2),
            "e2e": dict(repeats=1, steps=2),
        }
    return {
        "loss": dict(rows=8, tokens=4096, prompt_len=512, repeats=101),
        "mask": dict(responses=2048, max_len=15360, repeats=2),
        "old_pass": dict(tokens=1024, repeats=3),
        "quantile": dict(worlds=(2, 3, 4), per_rank=100_000, micro_tokens=8 * 4096, repeats=30),
        "entropy": dict(tokens=256, chunk=64, repeats=5),
        "e2e": dict(repeats=2, steps=6),
    }


def _row(*cells) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _f(x, digits=2):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return f"{x:.{digits}f}"


# ---------------------------------------------------------------- the benchmarks, each -> markdown


def bench_loss(cfg, device) -> tuple[str, list[dict]]:
    from benchmarks import loss_path

    rows = loss_path.run(device=device, **cfg)
    lines = [
        _row("case", "variant", "median ms", "spread", "ratio vs vanilla: of medians, paired",
             "ratio vs vanilla+H: of medians, paired", "peak tensor memory", "memory vs vanilla",
             "largest tensor (elements, per token)"),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cuda = f" (CUDA peak {fmt_bytes(r['cuda_peak_bytes'])})" if r.get("cuda_peak_bytes") is not None else ""
        lines.append(
            _row(
                r["case"],
                r["variant"],
                _f(r["median_ms"]),
                _f(r["spread"]),
                f"{_f(r['ratio_vs_vanilla'], 3)}, {_f(r['paired_vs_vanilla'], 3)}",
                f"{_f(r['ratio_vs_vanilla_H'], 3)}, {_f(r['paired_vs_vanilla_H'], 3)}",
                f"{fmt_bytes(r.get('peak_tensor_bytes'))}{cuda}",
                _f(r.get("mem_ratio_vs_vanilla"), 3),
                f"{r.get('largest_numel', 0):,} ({_f(r.get('largest_per_token'))})",
            )
        )
    old = [r["ratio_vs_vanilla"] for r in rows if r["variant"] == "stapo/old"]
    old_paired = [r["paired_vs_vanilla"] for r in rows if r["variant"] == "stapo/old"]
    cur = [r for r in rows if r["variant"] == "stapo/current"]
    with_h = {r["case"]: r["median_ms"] for r in rows if r["variant"] == "vanilla+H"}
    added = [r["median_ms"] - with_h[r["case"]] for r in cur]
    largest = max(r.get("largest_per_token", 0) for r in rows)
    tokens = rows[0]["tokens"]
    lines += [
        "",
        f"- `stapo/old` / `vanilla`: ratio of medians {min(old):.3f} to {max(old):.3f}, paired "
        f"{min(old_paired):.3f} to {max(old_paired):.3f} over the advantage patterns (target: within 1.05).",
        f"- `stapo/current` adds {min(added):.1f} to {max(added):.1f} ms per micro-batch of {tokens:,} response tokens "
        f"over `vanilla+H` (ratio {min(r['ratio_vs_vanilla_H'] for r in cur):.2f} to "
        f"{max(r['ratio_vs_vanilla_H'] for r in cur):.2f}).",
        f"- Largest tensor any variant creates: {largest:.2f} x the micro-batch's sequence tokens (prompt + response), "
        "i.e. per-token vectors; no tensor has a vocabulary dimension.",
    ]
    return "\n".join(lines), rows


def bench_mask(cfg, pass_cfg, device) -> tuple[str, list[dict]]:
    from benchmarks import mask_build, old_pass

    cost = old_pass.measure(device=device, **pass_cfg)
    rows = mask_build.run(device=device, **cfg)
    lines = [
        f"Yardstick, measured in this run: verl's old-log-prob pass (network forward, then verl's "
        f"`logprobs_from_logits` + `entropy_from_logits`) on {cost.model}, {cost.tokens} tokens: "
        f"{1000 * cost.network_s_per_token:.2f} ms/token network ({cost.achieved_flops / 1e9:.0f} GFLOP/s) + "
        f"{1000 * cost.head_s_per_token:.2f} ms/token verl head ops (spread {cost.spread:.2f}).",
        "",
        "| lengths | responses x max | response tokens (mean length, truncated) | candidates | masked (ratio) | "
        "detect s | diagnostics s | fold s | total s (spread) | peak tensor memory (inputs) | RSS peak delta | "
        "old pass, measured model: s (mask / pass) | old pass, Qwen3-1.7B by FLOPs: s (mask / pass) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lengths = r.pop("lengths")
        est = old_pass.batch_estimate(cost, lengths, mask_build.PROMPT_LEN)
        r.update(est)
        r["ratio_measured_model"] = r["total_s"] / est["measured_model_s"]
        r["ratio_qwen3_1p7b"] = r["total_s"] / est["qwen3_1p7b_s"]
        lines.append(
            _row(
                r["distribution"],
                f"{r['responses']} x {r['max_len']}",
                f"{r['tokens']:,} ({r['mean_len']:.0f}, {100 * r['truncated_share']:.1f}%)",
                f"{r['candidates']:,}",
                f"{r['masked']:,} ({r['mask_ratio']:.1e})",
                _f(r["detect_s"]),
                _f(r["diagnostics_s"]),
                _f(r["fold_s"]),
                f"{_f(r['total_s'])} ({_f(r['total_spread'])})",
                f"{fmt_bytes(r.get('peak_tensor_bytes'))} ({fmt_bytes(r['input_bytes'])})",
                fmt_bytes(r["rss_peak_delta_bytes"]),
                f"{est['measured_model_s']:,.0f} ({r['ratio_measured_model']:.1e})",
                f"{est['qwen3_1p7b_s']:,.0f} ({r['ratio_qwen3_1p7b']:.1e})",
            )
        )
    fields = ("model", "params", "tokens", "network_s_per_token", "head_s_per_token", "achieved_flops", "spread")
    cost_row = {"bench": "old_pass", **{k: getattr(cost, k) for k in fields}}
    return "\n".join(lines), [cost_row, *rows]


def bench_quantile(cfg, device) -> tuple[str, list[dict]]:
    from benchmarks import dp_quantile

    rows = dp_quantile.run(**cfg)
    lines = [
        "| ranks | values per rank | global_quantile ms | local linear_quantile ms | ratio | "
        "detect_spurious with group ms | without ms | ratio | worst spread |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            _row(
                r["world"],
                f"{r['per_rank']:,}",
                *(_f(r[k]) for k in ("global_q_ms", "local_q_ms", "q_ratio", "detect_group_ms", "detect_local_ms")),
                _f(r["detect_ratio"]),
                _f(r["spread"]),
            )
        )
    lines += ["", f"`detect_spurious` runs on one micro-batch of {rows[0]['micro_tokens']:,} response tokens per rank."]
    return "\n".join(lines), rows


def bench_entropy(cfg, device) -> tuple[str, list[dict]]:
    from benchmarks import entropy

    rows = entropy.run(device=device, **cfg)
    r0 = rows[0]
    lines = [
        f"{r0['tokens']:,} tokens x vocabulary {r0['vocab']:,}, fp32 logits ({fmt_bytes(r0.get('logits_bytes'))}), "
        f"chunk size {r0['chunk']} for the chunked variant.",
        "",
        "| variant | median ms | ms per 1k tokens | spread | ratio vs logp | peak tensor memory | memory vs logp |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cuda = f" (CUDA peak {fmt_bytes(r['cuda_peak_bytes'])})" if r.get("cuda_peak_bytes") is not None else ""
        lines.append(
            _row(
                r["variant"],
                _f(r["median_ms"]),
                _f(r["ms_per_1k_tokens"]),
                _f(r["spread"]),
                _f(r["ratio_vs_logp"], 3),
                f"{fmt_bytes(r.get('peak_tensor_bytes'))}{cuda}",
                _f(r.get("mem_ratio_vs_logp"), 3),
            )
        )
    return "\n".join(lines), rows


def bench_e2e(cfg, device) -> tuple[str, list[dict]]:
    from benchmarks import e2e_step

    result = e2e_step.run(**cfg)
    if result.get("error"):
        first, _, rest = result["error"].partition("\n")
        body = f"Not measured in this run, no figures: {first}"
        return body + (f"\n\n```\n{rest.strip()}\n```" if rest.strip() else ""), [result]
    lines = [
        "| algo | median timing_s/step | samples (steps 2.., every run) | runs |",
        "|---|---|---|---|",
    ]
    for algo in ("stapo", "justrl"):
        s = result["samples"][algo]
        lines.append(f"| {algo} | {_f(result[algo + '_s'])} | {', '.join(_f(x) for x in s)} | {result['runs']} |")
    lines += [
        "",
        f"Ratio stapo / justrl (medians): **{result['ratio']:.3f}**; median of the per-run-pair ratios: "
        f"{result['pair_ratio']:.3f}; per-step spread stapo {_f(result['spread']['stapo'])}, "
        f"justrl {_f(result['spread']['justrl'])}.",
        "",
        "Medians of verl's phase timings (s; the S2T mask is built and folded in `adv`):",
        "",
        "| phase | stapo | justrl | ratio |",
        "|---|---|---|---|",
    ]
    for phase, values in result["phases"].items():
        ratio = values["stapo"] / values["justrl"] if values["justrl"] else math.nan
        lines.append(f"| `{phase}` | {_f(values['stapo'], 3)} | {_f(values['justrl'], 3)} | {_f(ratio, 3)} |")
    return "\n".join(lines), [result]


# ---------------------------------------------------------------- BENCHMARKS.md

INTRO = """# Benchmarks

What STAPO costs on top of verl 0.9.1. Every figure is a ratio against verl's own code path
measured in the same run, on the same machine, variants interleaved (A, B, C, then B, C, A, ...)
after a warm-up; medians, with the spread ((max - min) / median) as the record of the noise.

Run them with `python -m benchmarks.run` (all: 15-20 minutes on this loaded 2-core machine, 11 of them
the end-to-end trainer runs), `--only loss,mask`
for some, `--quick` for tiny sizes (nothing written), `--device cuda` on a GPU machine (the GPU's
name is recorded). Each section below was written by the run named in its header, and a later
`--only` run replaces only its own sections.

**These are CPU figures.** No GPU was available to the session that produced them. The machine is
shared with other engineers' trainer runs, so absolute times are noisy; the ratios are what to read.
Torch runs single-threaded here by default (`--threads 1`): on a loaded 2-core machine, OpenMP's
spinning barriers made two-thread timings of the same op vary 20-fold (verl's row-by-row
`logprobs_from_logits_v2`: 1.0-1.6 s with one thread, 3.7-52 s with two). The setting applies to
the benchmark process; the trainer runs of section 4 keep their own settings.

Memory is *peak live tensor bytes*: a torch dispatch mode (`benchmarks/common.py`) sees every tensor
the measured code creates, forward and backward, and sums the storages still alive; inputs built
before the measurement are not counted. This is exact for tensors and independent of the allocator
and of other processes (tracemalloc cannot see torch's allocations). On CUDA
`torch.cuda.max_memory_allocated` is reported beside it. The mask benchmark also reports the
process's peak RSS growth (VmHWM reset through /proc), which includes allocator overhead.
"""


def _section(name: str, body: str, header: str) -> str:
    return f"<!-- bench:{name} -->\n## {TITLES[name]}\n\n{header}\n\n{body}\n<!-- /bench:{name} -->"


def _placeholder(name: str) -> str:
    return _section(name, "Not run yet: `python -m benchmarks.run --only " + name + "`.", "")


def update_doc(sections: dict[str, str], doc: Path = DOC) -> None:
    text = doc.read_text() if doc.exists() else ""
    if "<!-- bench:" not in text:  # first run, or a file from before the sections: start over
        text = INTRO + "\n" + "\n\n".join(_placeholder(n) for n in NAMES) + "\n\n" + NOTES_MARK + "\n"
    for name, section in sections.items():
        pattern = re.compile(rf"<!-- bench:{name} -->.*?<!-- /bench:{name} -->", re.S)
        if pattern.search(text):
            text = pattern.sub(lambda _: section, text)
        else:
            text = text.replace(NOTES_MARK, section + "\n\n" + NOTES_MARK)
    doc.write_text(text)


NOTES_MARK = "<!-- notes: written by hand below this line -->"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
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
    args = parser.parse_args(argv)

    chosen = [n.strip() for n in args.only.split(",") if n.strip()] or list(NAMES)
    skip = {n.strip() for n in args.skip.split(",") if n.strip()}
    unknown = [n for n in [*chosen, *skip] if n not in NAMES]
    if unknown:
        parser.error(f"unknown benchmark(s) {unknown}; choose from {', '.join(NAMES)}")
    chosen = [n for n in chosen if n not in skip]
    if args.threads < 1:
        parser.error("--threads must be >= 1")
    torch.set_num_threads(args.threads)
    device = pick_device(args.device)
    cfg = sizes(args.quick)
    info = machine_info(device)
    command = "python -m benchmarks.run" + ("" if not argv else " " + " ".join(shlex.quote(a) for a in argv))

    runners = {
        "loss": lambda: bench_loss(cfg["loss"], device),
        "mask": lambda: bench_mask(cfg["mask"], cfg["old_pass"], device),
        "quantile": lambda: bench_quantile(cfg["quantile"], device),
        "entropy": lambda: bench_entropy(cfg["entropy"], device),
        "e2e": lambda: bench_e2e(cfg["e2e"], device),
    }
    sections, dump = {}, {}
    for name in chosen:
        load_before = load_average()
        started = time.perf_counter()
        print(f"== {TITLES[name]} ...", file=sys.stderr, flush=True)
        body, rows = runners[name]()
        seconds = time.perf_counter() - started
        header = (
            f"Run: `{command}` on {datetime.date.today().isoformat()}, {seconds:.0f} s. "
            f"Machine: {info['cpu']}, {info['cores']} cores, torch {info['torch']} ({args.threads} thread"
            f"{'s' if args.threads > 1 else ''}), device {info['device']}, GPU: {info['gpu']}. "
            f"Load average before / after: {load_before} / {load_average()}."
        )
        print(f"\n## {TITLES[name]}\n\n{header}\n\n{body}\n", flush=True)
        sections[name] = _section(name, body, header)
        dump[name] = rows
    if args.json:
        args.json.write_text(json.dumps(dump, indent=1, default=str))
    if (args.write or not args.quick) and not args.no_write:
        update_doc(sections)
        print(f"updated {DOC.relative_to(ROOT)}: {', '.join(sections)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
