"""The HF server's draw of a decode step's tokens: one ``torch.multinomial`` call a row against the exponential race.

Every row of the HF server's decode draws from its own seeded generator (docs/reproducibility.md), so the draw
went row by row: one ``multinomial`` call per row and token, 512 a validation step. ``stapo.verl_plugin.cpu.
sampling.draw_tokens`` now draws only each row's Exp(1) noise row by row and divides and takes the argmax over all
rows at once, which is what ``multinomial(p, 1)`` computes, so the tokens are the same (checked here on every
timed call). Sizes: a testbed step (8 x 8 rows) and validation (64 x 8 rows) at the testbed's vocabulary of 27 and
the tailbed's of 4,096, at T=1 / top-p=1 (training) and T=0.7 / top-p=0.9 (the paper's second decoding, whose
per-row nucleus filter both variants share). Times are of one decode step's draw.
"""

from __future__ import annotations

import torch

from benchmarks.common import fmt_num, interleaved, md_row

NAME = "draw"
TITLE = "8. The HF server's draw: a multinomial call a row against the exponential race over all rows"
SIZES = {
    "quick": {"shapes": ((4, 27, 1.0, 1.0),), "repeats": 1},
    "full": {
        "shapes": ((64, 27, 1.0, 1.0), (512, 27, 1.0, 1.0), (64, 4096, 1.0, 1.0), (512, 4096, 1.0, 1.0),
                   (512, 4096, 0.7, 0.9)),
        "repeats": 20,
    },
}


def row_by_row(logits: torch.Tensor, sampling, generators) -> list[int]:
    """The draw as it was: the same probabilities, one ``multinomial`` call a row."""
    from stapo.verl_plugin.cpu.sampling import sampling_probabilities

    probs = sampling_probabilities(logits, sampling)
    return [int(torch.multinomial(probs[row], 1, generator=generator)) for row, generator in enumerate(generators)]


def measure(device, shapes, repeats) -> list[dict]:
    from stapo.verl_plugin.cpu.sampling import Sampling, draw_tokens

    rows_out = []
    for rows, vocab, temperature, top_p in shapes:
        sampling = Sampling(temperature=temperature, top_p=top_p)
        logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(0)) * 4
        drawn: dict[str, list[list[int]]] = {"row by row": [], "race": []}

        def variant(name, draw):
            def prepare():
                generators = [torch.Generator().manual_seed(1000 + row) for row in range(rows)]

                def run():
                    drawn[name].append(draw(logits, sampling, generators))

                return run

            return prepare

        timings = interleaved({"row by row": variant("row by row", row_by_row), "race": variant("race", draw_tokens)},
                              repeats, device)
        old_s, new_s = timings["row by row"].median, timings["race"].median
        rows_out.append({
            "bench": NAME, "rows": rows, "vocab": vocab, "temperature": temperature, "top_p": top_p,
            "row_by_row_s": old_s, "race_s": new_s, "ratio": new_s / old_s,
            "same_tokens": drawn["row by row"] == drawn["race"],
            "spread": max(timings["row by row"].spread, timings["race"].spread),
        })
    return rows_out


def render(rows: list[dict]) -> str:
    lines = [
        "| rows x vocabulary | T / top-p | a multinomial a row, ms | exponential race, ms | ratio | same tokens | "
        "worst spread |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(md_row(f"{r['rows']} x {r['vocab']}", f"{r['temperature']:g} / {r['top_p']:g}",
                            fmt_num(r["row_by_row_s"] * 1e3), fmt_num(r["race_s"] * 1e3), fmt_num(r["ratio"]),
                            "yes" if r["same_tokens"] else "NO", fmt_num(r["spread"])))
    lines += ["", "One decode step's draw from fresh per-row generators (seeded alike for both), medians of "
              "interleaved calls in one process; 'same tokens': every timed call of each drew the same tokens."]
    return "\n".join(lines)
