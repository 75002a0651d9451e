"""Entropy events of a run, counted by one fixed rule, and how often each group of a comparison had one.

What the paper reports of GRPO-style training is an event, not a mean: the entropy of a run explodes (JustRL,
20-Entropy) or collapses (GRPO) while another's stays flat. A mean over seeds hides an event that hit two runs of
eight; a count does not. The rule (docs/algorithm.md section 5), fixed before any run of the learning-rate stress
ended (results/tailbed-lr5e-5/COMMAND) and kept fixed here so that no comparison tunes it to its runs:

- an **explosion**: a step, 2 or later, whose mean entropy of a response token is above ``EXPLOSION`` times the
  run's step-1 value;
- a **collapse**: such a step below ``COLLAPSE`` times it;
- a step whose mean entropy is **not a finite number** (NaN, infinite) is an explosion at that step: the
  entropy has left the numbers, which is what an explosion is, and a comparison (NaN > x is false) would
  otherwise count the worst run as calm. When step 1's own entropy is not finite, step 1 is that explosion
  and no collapse can be measured against it;
- an explosion is **tail-driven** when at that step the probability mass a position puts on tokens the task never
  needs (``actor/stapo/tail/unused_mass_mean``) is above ``TAIL`` times its step-1 value (runs of a model without
  such tokens log none: their explosions are neither tail-driven nor not).

A group's count is the number of its runs with at least one event of a kind. Two groups' counts are set against
each other by Fisher's exact test, two-sided (no direction assumed: a comparison written after its runs has not
said in advance which group should have fewer). Pure Python on the comparison's per-run series.
"""

from __future__ import annotations

from math import comb, isfinite

EXPLOSION = 2.0
COLLAPSE = 0.5
TAIL = 10.0
KINDS = ("explosion", "tail_driven", "collapse")
RULE = {"explosion_above": EXPLOSION, "collapse_below": COLLAPSE, "tail_above": TAIL, "relative_to_step": 1}


def run_events(entropy: dict[int, float], tail_mass: dict[int, float]) -> dict[str, list[int] | None]:
    """The steps of each kind of event of one run, from its per-step mean entropy and unused-token mass (up to the
    compared step). A kind is None where the run cannot show it: no entropy at step 1 (no kind), no tail mass at
    step 1 (``tail_driven``), a non-finite entropy at step 1 (``collapse``). A non-finite entropy is an explosion."""
    if 1 not in entropy:
        return dict.fromkeys(KINDS)
    first = entropy[1]
    later = sorted(step for step in entropy if step >= 2)
    if not isfinite(first):  # nothing to measure against: every non-finite step is an explosion, step 1 first
        explosion = [1, *(step for step in later if not isfinite(entropy[step]))]
        collapse = None
    else:
        explosion = [step for step in later if not isfinite(entropy[step]) or entropy[step] > EXPLOSION * first]
        collapse = [step for step in later if isfinite(entropy[step]) and entropy[step] < COLLAPSE * first]
    tail_driven = None
    if 1 in tail_mass:
        tail_driven = [step for step in explosion if step in tail_mass and tail_mass[step] > TAIL * tail_mass[1]]
    return {"explosion": explosion, "tail_driven": tail_driven, "collapse": collapse}


def group_events(runs: list[dict]) -> dict[str, dict]:
    """Per kind, over a group's runs (``events`` of each): ``{"runs": n with one, "of": n that can show it, "seeds":
    [the seeds with one]}``."""
    out = {}
    for kind in KINDS:
        known = [run for run in runs if run["events"][kind] is not None]
        hit = [run for run in known if run["events"][kind]]
        out[kind] = {"runs": len(hit), "of": len(known), "seeds": [run["seed"] for run in hit]}
    return out


def fisher_two_sided(hit_a: int, n_a: int, hit_b: int, n_b: int) -> float | None:
    """Fisher's exact test of a 2x2 table (runs with an event, of ``n_a`` and ``n_b``): the probability, with the
    margins fixed, of a table no more likely than the one seen. None for an empty group."""
    if n_a == 0 or n_b == 0:
        return None
    hits, total = hit_a + hit_b, n_a + n_b

    def probability(k: int) -> float:
        return comb(n_a, k) * comb(n_b, hits - k) / comb(total, hits)

    seen = probability(hit_a)
    tables = range(max(0, hits - n_b), min(hits, n_a) + 1)
    # a relative tolerance, as R and SciPy use, so a table as likely as the one seen is not lost to rounding
    return min(1.0, sum(p for k in tables if (p := probability(k)) <= seen * (1 + 1e-7)))


def _count(found: dict) -> str:
    if not found["of"]:
        return "-"
    seeds = f" ({', '.join('?' if s is None else str(s) for s in found['seeds'])})" if found["runs"] else ""
    return f"{found['runs']} of {found['of']}{seeds}"


def events_table(groups: list[dict], baseline: str | None) -> str:
    """comparison.md's table of entropy events (each group's ``events``; with a baseline, Fisher's p of each other
    group against it); empty when no run could show one."""
    if not any(group["events"]["explosion"]["of"] for group in groups):
        return ""
    base = next((group for group in groups if group["group"] == baseline), None)
    titles = ["runs with an explosion", "with a tail-driven explosion", "with a collapse"]
    if base is not None:
        titles += [f"p vs {baseline}: {kind}" for kind in ("explosion", "tail-driven", "collapse")]
    rows = ["\n| group | " + " | ".join(titles) + " |", "|---|" + "---|" * len(titles)]
    for group in groups:
        cells = [_count(group["events"][kind]) for kind in KINDS]
        if base is not None:
            for kind in KINDS:
                mine, theirs = group["events"][kind], base["events"][kind]
                p = fisher_two_sided(mine["runs"], mine["of"], theirs["runs"], theirs["of"])
                cells.append("" if group is base or p is None else f"{p:.3g}")
        rows.append(f"| {group['group']} | " + " | ".join(cells) + " |")
    note = (
        f"\nEntropy events (stapo/runs/events.py, a rule fixed before the runs it was first used on): a step, 2 or "
        f"later, whose mean entropy of a response token is above {EXPLOSION:g}x the run's step-1 value is an "
        f"explosion, below {COLLAPSE:g}x a collapse; an explosion is tail-driven when the unused-token mass a position "
        f"is above {TAIL:g}x its step-1 value at that step; a step whose mean entropy is not a finite number is an "
        "explosion. Runs with at least one, of those that can show it, and "
        "their seeds; p: Fisher's exact test, two-sided, on the runs with and without one, unpaired.\n"
    )
    return "\n".join(rows) + "\n" + note
