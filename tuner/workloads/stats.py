"""Plain arithmetic on repeated samples (no pydantic, no torch: also used on GPU machines)."""
from __future__ import annotations

import math
import statistics
from typing import Sequence


def rel_spread(samples: Sequence[float]) -> float:
    """The measured spread of repeats relative to their median: the interquartile range with 4
    or more samples (robust to the odd preempted run), half the range with 2-3 (0 with fewer).
    For evenly spread repeats both equal the half-range; for normal noise the IQR is ~1.35
    standard deviations of one sample, about twice the standard error of a difference of
    medians of 5-10 repeats each."""
    n = len(samples)
    if n < 2:
        return 0.0
    med = statistics.median(samples)
    if not med:
        return 0.0
    if n < 4:
        return (max(samples) - min(samples)) / 2.0 / med
    q = statistics.quantiles(samples, n=4, method="inclusive")
    return (q[2] - q[0]) / med


def geomean(values: Sequence[float]) -> float:
    vals = [v for v in values if v > 0]
    if not vals:
        return 0.0
    return math.exp(sum(math.log(v) for v in vals) / len(vals))
