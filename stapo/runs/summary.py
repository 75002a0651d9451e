"""One run's values as a comparison reads them, all taken at one step of the comparison's choosing.

A comparison pairs runs seed by seed, so every value of every run must come from the same step: a run
stopped at step 45 must not have its held-out accuracy at step 40 set against another run's step 60.
``summarize_run`` is therefore given the step (``at``) and the held-out steps every compared run shares
(``acc_steps``); it never picks a run's own last step. Which runs reach which step is decided once, for
the whole comparison, by ``stapo.runs.compare.comparison_step``.

Per run, at step ``at``:
- ``final_acc``: held-out accuracy at the last shared held-out step <= ``at``;
- ``best_acc``: the best of the shared held-out steps in 1..``at``; step 0, the untrained model that the
  testbed preset validates before training, is never a "best" (it is ``initial_acc``);
- ``late_reward``: the training reward averaged over the ``LATE_STEPS`` steps ending at ``at`` (one
  step's reward is a few prompts' luck);
- ``entropy_first`` / ``entropy_last``: the mean entropy of a response token at the first logged step and
  at ``at``;
- ``mask_ratio``, ``grad_share``: over steps 1..``at`` (docs/algorithm.md section 5);
- the tail (docs/algorithm.md section 5; logged on the driver's diagnostic steps, None where a run logged
  none, e.g. on vLLM or a model without unused tokens): ``tail_mass`` / ``tail_mass_late``, the mean
  probability mass a position puts on tokens the task never needs, over steps 1..``at`` and over the last
  ``LATE_STEPS``; ``tail_mass_peak``, the largest single position's mass in any step; ``entropy_max_peak``,
  the largest single position's entropy in any step; ``entropy_peak``, the largest mean entropy of any
  step (an explosion that has passed by ``at`` still shows here); ``norm_share``, the mean over steps of
  the S2T tokens' (silenced, or would-be-silenced for algorithms without the mask) share of the positive
  tokens' exact logit-gradient norm;
- ``initial_acc@<name>`` / ``final_acc@<name>``, for each decoding setting of ``stapo.eval.core.DECODING``: the
  held-out accuracy of the extra validation pass at that setting (``stapo.val_decodings``, logged as
  ``val@<name>/average/acc``) at step 0 and at the last shared held-out step; None where the run has none;
- ``events``: the steps of its entropy events (``stapo.runs.events``: explosion, tail-driven, collapse);
- ``nonfinite``: the (step, key) of every non-finite value among the metrics these are read from, up to ``at``
  (the comparison warns of each: such a value makes the run's value NaN, and the mean leaves the run out);
- ``wall_s``: the sweep's own clock summed over the run's segments (a resumed run's restarts included)
  when every compared run ran to its end at ``at``, else the logged step times up to ``at``.

``series`` keeps the per-step values of ``SERIES`` up to ``at`` so that every figure a README quotes
of a recorded comparison can be recomputed from ``comparison.json`` alone.

Pure Python on the run folders' metrics (no verl, no torch).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from stapo.eval.core import DECODING
from stapo.eval.val_metrics import benchmark_val_metrics, decoding_key
from stapo.rundir import ENTROPY_MAX, ENTROPY_TOKEN_MEAN, TAIL_MASS, TAIL_MASS_MAX, TAIL_SAMPLED, VERL_ENTROPY
from stapo.runs.events import run_events
from stapo.runs.folder import STEP_TIME, RunData, config_value, recorded_segments

ACC = "val/average/acc"
# verl aggregates actor/entropy over tokens with the actor's loss_agg_mode: only "token-mean" is the mean
# entropy of a response token (Dr.GRPO's seq-mean-token-sum-norm divides each sequence's sum by the
# maximum response length, so its entropy reads lower by about mean length / maximum length). The driver
# logs that mean for every mode (ENTROPY_TOKEN_MEAN): read first, actor/entropy for runs without it
ENTROPY = VERL_ENTROPY
AGG_MODE = "actor_rollout_ref.actor.loss_agg_mode"
TOKEN_MEAN = "token-mean"
MASK = "actor/stapo/mask_ratio"
# the spurious tokens' and all positive-advantage tokens' summed gradient-norm bounds, per step
GRAD_BOUND = ("actor/stapo/grad_bound_spurious", "actor/stapo/grad_bound_positive")
REWARD = ("critic/score/mean", "critic/rewards/mean")
# the exact grad-norm shares (the driver logs stapo.algorithm.gradnorm.exact_norm_shares' keys under actor/stapo/)
NORM_SHARE = "actor/stapo/grad_norm_share_spurious"
NORM_SQ_SHARE = "actor/stapo/grad_norm_sq_share_spurious"
LATE_STEPS = 10
TAIL_QUANTITIES = ("tail_mass", "tail_mass_late", "tail_mass_peak", "entropy_max_peak", "entropy_peak", "norm_share")
# held-out accuracy of the further validation passes (stapo.val_decodings), by decoding setting
DECODING_ACC = {name: decoding_key(ACC, name) for name in DECODING}
DECODING_QUANTITIES = tuple(f"{stat}@{name}" for name in DECODING for stat in ("initial_acc", "final_acc"))
QUANTITIES = (
    "initial_acc", "final_acc", "best_acc", "late_reward", "entropy_first", "entropy_last", "mask_ratio",
    "grad_share", "wall_s", *TAIL_QUANTITIES, *DECODING_QUANTITIES,
)
# kept per step in comparison.json (under the name on the left) where the run logged them
SERIES = {
    "held_out_acc": ACC,
    "reward": REWARD[0],
    "entropy": ENTROPY_TOKEN_MEAN,
    "mask_ratio": MASK,
    "num_spurious": "actor/stapo/num_spurious",
    "num_response_tokens": "actor/stapo/num_response_tokens",
    "grad_bound_spurious": GRAD_BOUND[0],
    "grad_bound_positive": GRAD_BOUND[1],
    "pg_clipfrac": "actor/pg_clipfrac",
    "pg_clipfrac_lower": "actor/pg_clipfrac_lower",
    "ppo_kl": "actor/ppo_kl",
    "grad_norm": "actor/grad_norm",
    "step_s": STEP_TIME,
    "tail_mass": TAIL_MASS,
    "tail_mass_max": TAIL_MASS_MAX,
    "tail_sampled": TAIL_SAMPLED,
    "entropy_max": ENTROPY_MAX,
    "norm_share": NORM_SHARE,
    "norm_sq_share": NORM_SQ_SHARE,
}


# every metric a run's values above are read from: a non-finite value of one of them, at a compared step, is named
# in the comparison's warnings (a NaN makes the run's value NaN, and mean_se leaves the run out of its group's n)
COMPARED_KEYS = tuple(dict.fromkeys((
    ACC, *REWARD, ENTROPY_TOKEN_MEAN, ENTROPY, MASK, *GRAD_BOUND, STEP_TIME, TAIL_MASS, TAIL_MASS_MAX, ENTROPY_MAX,
    NORM_SHARE, *DECODING_ACC.values(), *SERIES.values(),
)))


def nonfinite_values(steps: dict[int, dict[str, float]], keys=COMPARED_KEYS) -> list[tuple[int, str]]:
    """``(step, key)`` of every value of ``keys`` in ``steps`` that is not a finite number, in step order."""
    return [
        (step, key) for step in sorted(steps) for key in keys
        if key in steps[step] and not math.isfinite(steps[step][key])
    ]


def accuracy_series(steps: dict[int, dict[str, float]]) -> dict[int, float]:
    """Held-out accuracy per validated step: ``val/average/acc``, else derived from ``val-core/...`` keys."""
    out = {}
    for step, metrics in steps.items():
        if ACC in metrics:
            out[step] = metrics[ACC]
        elif (derived := benchmark_val_metrics(metrics).get(ACC)) is not None:
            out[step] = derived
    return out


def key_series(steps: dict[int, dict[str, float]], key: str) -> dict[int, float]:
    return {step: metrics[key] for step, metrics in steps.items() if key in metrics}


def trained_steps(run: RunData) -> list[int]:
    """The steps the run trained (logged a step time), in order."""
    return sorted(step for step, metrics in run.steps.items() if STEP_TIME in metrics)


def last_step(run: RunData) -> int:
    """The last step the run trained; for metrics without verl's step time (logged by other means), the
    last step logged; 0 when none."""
    trained = trained_steps(run) or sorted(run.steps)
    return trained[-1] if trained else 0


def configured_steps(run: RunData) -> int | None:
    """``trainer.total_training_steps`` of the run's config.yaml (None without one)."""
    value = config_value(run.path, "trainer.total_training_steps")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def up_to(series: dict[int, float], at: int) -> dict[int, float]:
    return {step: value for step, value in series.items() if step <= at}


def step_mean(series: dict[int, float], last: int | None = None) -> float | None:
    """Mean of a per-step series, over its ``last`` steps when given; None when empty."""
    values = [series[step] for step in sorted(series)[-last if last else 0:]]
    return math.fsum(values) / len(values) if values else None


def last_steps(series: dict[int, float], at: int, count: int) -> dict[int, float]:
    """The values of the ``count`` steps ending at ``at`` (the late window of a run read at ``at``)."""
    return {step: value for step, value in series.items() if at - count < step <= at}


def step_max(series: dict[int, float]) -> float | None:
    """The largest value; NaN when one is NaN (``max`` would keep or drop it by its place in the series)."""
    if any(math.isnan(value) for value in series.values()):
        return math.nan
    return max(series.values()) if series else None


def pooled_share(steps: dict[int, dict[str, float]], part: str, whole: str) -> float | None:
    """``sum(part) / sum(whole)`` over the steps that logged both: the run's share, each step weighted by
    its own total (a mean of per-step ratios would give a step with one positive token the weight of
    a step with thousands). None when nothing was logged or the total is 0."""
    pairs = [(metrics[part], metrics[whole]) for metrics in steps.values() if part in metrics and whole in metrics]
    total = math.fsum(w for _, w in pairs)
    return math.fsum(p for p, _ in pairs) / total if pairs and total > 0 else None


def logged_token_mean_entropy(run: RunData) -> bool:
    return any(ENTROPY_TOKEN_MEAN in metrics for metrics in run.steps.values())


def ran_to_the_end(run: RunData, at: int) -> bool:
    """The run is compared at its last step, and that is the step it was configured to reach."""
    configured = configured_steps(run)
    return at == last_step(run) and (configured is None or at >= configured)


def wall_seconds(run: RunData, at: int, whole_runs: bool) -> float | None:
    """``whole_runs`` (every compared run ran to the end at ``at``): the sweep's clock over every segment of the
    run, start-up included; otherwise, or for a run the sweep did not time, the logged step times up to ``at``
    (one measure for every run of a comparison)."""
    segments = recorded_segments(run.record)
    if segments and whole_runs:
        return float(math.fsum(segments))
    timing = up_to(key_series(run.steps, STEP_TIME), at)
    return math.fsum(timing.values()) if timing else None


@dataclass
class RunSummary:
    run: RunData
    at: int  # the step every value is taken at
    values: dict[str, float | None]
    entropy: dict[int, float]
    entropy_token_mean: bool  # the entropy series is the mean entropy of a response token
    entropy_agg: str  # the run's loss_agg_mode ("None": no config.yaml beside the metrics)
    series: dict[str, dict[int, float]]
    events: dict[str, list[int] | None]  # stapo.runs.events.run_events, up to ``at``
    nonfinite: list[tuple[int, str]] = field(default_factory=list)  # (step, key): non-finite values read, up to at

    def to_json(self) -> dict:
        return {
            "run_dir": str(self.run.path),
            "seed": self.run.seed,
            "steps_trained": self.steps_trained,
            "last_step": last_step(self.run),
            "compared_at": self.at,
            **self.values,
            "entropy_trajectory": {str(k): v for k, v in self.entropy.items()},
            "entropy_token_mean": self.entropy_token_mean,
            "series": {name: {str(k): v for k, v in values.items()} for name, values in self.series.items()},
            "events": self.events,
            "nonfinite": [{"step": step, "key": key} for step, key in self.nonfinite],
        }

    @property
    def steps_trained(self) -> int:
        return len(trained_steps(self.run))


def summarize_run(
    run: RunData, at: int | None = None, acc_steps: list[int] | None = None, late_steps: int = LATE_STEPS,
    token_mean_entropy: bool = True, whole_runs: bool | None = None,
) -> RunSummary:
    """The run's values at step ``at`` (default: its last trained step), held-out accuracy read at
    ``acc_steps`` (default: the steps it validated); see the module docstring.

    ``token_mean_entropy``: read the entropy from ``ENTROPY_TOKEN_MEAN`` where the run logged it (a group
    reads one source for all its runs: ``stapo.runs.compare.summarize_group``). ``whole_runs``: every run of the
    comparison ran to its end at ``at`` (default: this one did), so wall times come from the sweep's clock."""
    at = last_step(run) if at is None else at
    whole_runs = ran_to_the_end(run, at) if whole_runs is None else whole_runs
    steps = {step: metrics for step, metrics in run.steps.items() if step <= at}
    acc = accuracy_series(steps)
    shared = sorted(step for step in (acc if acc_steps is None else acc_steps) if step in acc)
    trained_acc = [acc[step] for step in shared if step > 0]
    entropy = key_series(steps, ENTROPY_TOKEN_MEAN) if token_mean_entropy else {}
    agg = str(config_value(run.path, AGG_MODE))
    # None: no config.yaml beside the metrics (then taken as token-mean)
    token_mean = bool(entropy) or agg in ("None", TOKEN_MEAN)
    entropy = entropy or key_series(steps, ENTROPY)
    reward = next((s for key in REWARD if (s := key_series(steps, key))), {})
    late = last_steps(reward, at, late_steps)
    tail_mass = key_series(steps, TAIL_MASS)
    values = {
        "initial_acc": acc.get(0),
        "final_acc": acc[shared[-1]] if shared and shared[-1] > 0 else None,
        "best_acc": max(trained_acc) if trained_acc else None,
        "late_reward": step_mean(late),
        "entropy_first": entropy[min(entropy)] if entropy else None,
        "entropy_last": entropy.get(at),
        "mask_ratio": step_mean(key_series(steps, MASK)),
        "grad_share": pooled_share(steps, *GRAD_BOUND),
        "wall_s": wall_seconds(run, at, whole_runs),
        "tail_mass": step_mean(tail_mass),
        "tail_mass_late": step_mean(last_steps(tail_mass, at, late_steps)),
        "tail_mass_peak": step_max(key_series(steps, TAIL_MASS_MAX)),
        "entropy_max_peak": step_max(key_series(steps, ENTROPY_MAX)),
        "entropy_peak": step_max({step: v for step, v in entropy.items() if step > 0}),
        "norm_share": step_mean(key_series(steps, NORM_SHARE)),
    }
    series = {name: found for name, key in SERIES.items() if (found := key_series(steps, key))}
    if acc:
        series["held_out_acc"] = acc
    for name, key in DECODING_ACC.items():
        decoded = key_series(steps, key)
        values[f"initial_acc@{name}"] = decoded.get(0)
        values[f"final_acc@{name}"] = decoded.get(shared[-1]) if shared and shared[-1] > 0 else None
        if decoded:
            series[f"held_out_acc@{name}"] = decoded
    if entropy:
        series["entropy"] = entropy
    return RunSummary(
        run, at, values, entropy, token_mean, agg, series, run_events(entropy, tail_mass), nonfinite_values(steps)
    )
