"""The keep rule: is the candidate better than the incumbent beyond the measured noise?

Samples come in interleaved A/B pairs (incumbent, candidate) so slow drift (temperature, other
tenants) hits both sides alike. The decision works on log ratios of the pairs, with the noise
taken as the larger of the pairs' own spread and the run's pooled estimate of the workload's
sample-to-sample noise (a handful of pairs underestimates spread too often to trust alone).
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Optional

from tuner.trial import Measurement


@dataclass
class Decision:
    verdict: str  # "kept" | "reverted"
    reason: str  # "improved" | "within_noise" | "worse" | "size_regressed"
    gain: float  # candidate median / incumbent median - 1
    threshold: float  # the relative gain needed to keep
    stats: dict[str, Any] = field(default_factory=dict)


def rel_noise(samples: list[float]) -> float:
    """Relative standard deviation of repeated samples (0 with fewer than 2)."""
    if len(samples) < 2:
        return 0.0
    m = statistics.fmean(samples)
    return statistics.stdev(samples) / m if m else 0.0


def decide(
    incumbent: Measurement,
    candidate: Measurement,
    pooled_noise: float = 0.0,
    z: float = 2.0,
    min_gain: float = 0.0,
    size_tolerance: float = 0.01,
) -> Decision:
    a, b = incumbent.samples or [incumbent.value], candidate.samples or [candidate.value]
    n = min(len(a), len(b))
    logs = [math.log(b[i] / a[i]) for i in range(n) if a[i] > 0 and b[i] > 0]
    mean = statistics.fmean(logs) if logs else 0.0
    pair_sd = statistics.stdev(logs) if len(logs) > 1 else 0.0
    # one sample's relative noise → noise of a log ratio is √2 larger
    sd = max(pair_sd, math.sqrt(2.0) * pooled_noise)
    se = sd / math.sqrt(max(1, len(logs)))
    threshold = max(z * se, min_gain)
    gain = statistics.median(b) / statistics.median(a) - 1.0 if a and b else 0.0
    stats = {"pairs": len(logs), "mean_log_ratio": mean, "pair_sd": pair_sd,
             "pooled_noise": pooled_noise, "se": se}

    if mean > threshold:
        worst = _worst_size(incumbent, candidate, size_tolerance)
        if worst is not None:
            stats["regressed_size"] = worst
            return Decision("reverted", "size_regressed", gain, threshold, stats)
        return Decision("kept", "improved", gain, threshold, stats)
    if mean < -threshold:
        return Decision("reverted", "worse", gain, threshold, stats)
    return Decision("reverted", "within_noise", gain, threshold, stats)


def _worst_size(inc: Measurement, cand: Measurement, tol: float) -> Optional[dict[str, Any]]:
    """The size that regressed most beyond `tol`, or None (no per-size results, or none did)."""
    worst = None
    for size, a in inc.per_size.items():
        b = cand.per_size.get(size)
        if b is None or a <= 0:
            continue
        change = b / a - 1.0
        if change < -tol and (worst is None or change < worst["change"]):
            worst = {"size": size, "change": change}
    return worst


def pool(measurements: list[Measurement]) -> Optional[Measurement]:
    """Join repeated measurements of one side into one (samples concatenated, per-size medians)."""
    if not measurements:
        return None
    samples = [s for m in measurements for s in (m.samples or [m.value])]
    sizes: dict[str, list[float]] = {}
    for m in measurements:
        for k, v in m.per_size.items():
            sizes.setdefault(k, []).append(v)
    first = measurements[0]
    return Measurement(
        metric=first.metric, unit=first.unit, value=statistics.median(samples), samples=samples,
        per_size={k: statistics.median(v) for k, v in sizes.items()},
    )
