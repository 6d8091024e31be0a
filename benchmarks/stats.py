"""Summary statistics shared by the benchmarks."""

from __future__ import annotations

import math
import statistics


def percentile(values: list[float], p: float) -> float:
    """The `p` quantile (0 to 1) by linear interpolation between closest ranks, numpy's default;
    NaN for no values, so an empty class prints as such instead of failing the report."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    rank = (len(ordered) - 1) * p
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def median(values: list) -> float | None:
    """The median of the finite values; None when there are none."""
    values = [v for v in values if finite(v)]
    return statistics.median(values) if values else None
