"""verl's best@k / worst@k bootstrap of validation scores, computed in one numpy call per statistic.

verl's ``process_validation_metrics`` estimates, for every held-out prompt, variable (``acc``, ``score``,
``reward``) and k in 2, 4, ..., n, the mean and spread of the best and worst of k samples drawn with
replacement from the prompt's n: ``bootstrap_metric`` seeds numpy's global generator, draws 1,000 index rows
at once, then reduces each row with ``np.max`` / ``np.min`` on an object array, one Python-level call per row.
On a 64-problem x 8-sample testbed validation that is 1.15M numpy calls and about 9 s of the driver's time
in a 30-s validation (docs/benchmarks-history.md, "a validation's bootstrap vectorised").

:func:`best_worst_bootstrap` draws the same index rows from the same generator state and reduces them with one
``max`` / ``min`` over axis 1 of a float64 array: the maximum of real numbers is one of them, whatever the order
it is taken in, and float64 conversion keeps the order, so every row's value, and the mean and standard deviation
numpy then takes over the same float64 vector, are equal to verl's bit for bit
(tests/eval/test_bootstrap.py checks it against verl's own function). It answers only where that argument
holds (real numbers, no NaN or -0.0; reductions ``np.max`` / ``np.min``) and returns ``None`` elsewhere,
where the caller keeps verl's loop (majority votes over ``pred``, strings, NaN).
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence

import numpy as np

# the reductions verl's best@k / worst@k pass; each also reduces a matrix row by row (``axis=1``)
ROW_REDUCTIONS = frozenset({np.max, np.min, np.amax, np.amin})


def _real_values(data: Sequence) -> np.ndarray | None:
    """``data`` as float64 when every item is a real number that is neither NaN nor -0.0 (bools and numpy scalars
    included). Between 0.0 and -0.0, which compare equal, which one a max returns depends on the order the
    reduction takes them in; the sign would then show in a mean of zeros."""
    if not all(isinstance(item, numbers.Real) for item in data):
        return None
    values = np.array([float(item) for item in data], dtype=np.float64)
    if np.isnan(values).any() or np.signbit(values[values == 0]).any():
        return None
    return values


def best_worst_bootstrap(
    data: Sequence, subset_size: int, reduce_fns: Sequence[Callable], n_bootstrap: int = 1000, seed: int = 42
) -> list[tuple[float, float]] | None:
    """verl's ``bootstrap_metric(data, subset_size, reduce_fns, n_bootstrap, seed)`` for row-wise max / min
    reductions of real numbers, vectorised; ``None`` where it would not be equal bit for bit (the caller then
    runs verl's). Seeds numpy's global generator as verl does, and leaves it where verl's leaves it."""
    if not data or not all(fn in ROW_REDUCTIONS for fn in reduce_fns):
        return None
    values = _real_values(data)
    if values is None:
        return None
    np.random.seed(seed)
    indices = np.random.choice(len(values), size=(n_bootstrap, subset_size), replace=True)
    drawn = values[indices]
    per_fn = (fn(drawn, axis=1) for fn in reduce_fns)  # a new contiguous float64 vector, as verl's result row
    return [(float(np.mean(per_row)), float(np.std(per_row))) for per_row in per_fn]
