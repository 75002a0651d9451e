"""Mean and standard error over seeds, the one statistic every comparison and plot of runs uses."""

from __future__ import annotations

import math


def mean_se(values: list[float]) -> tuple[float | None, float | None, int]:
    """(mean, standard error of the mean, n) of the finite values; se is None below two values."""
    finite = [float(v) for v in values if v is not None and math.isfinite(v)]
    n = len(finite)
    if n == 0:
        return None, None, 0
    mean = math.fsum(finite) / n
    if n < 2:
        return mean, None, n
    variance = math.fsum((v - mean) ** 2 for v in finite) / (n - 1)
    return mean, math.sqrt(variance / n), n
