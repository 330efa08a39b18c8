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
from typing import Any, Optional, Sequence, Union

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


Side = Union[Measurement, Sequence[Measurement]]


def decide(
    incumbent: Side,
    candidate: Side,
    pooled_noise: float = 0.0,
    z: float = 2.0,
    min_gain: float = 0.0,
    size_tolerance: float = 0.01,
) -> Decision:
    """Each side is one Measurement or the list of its repeats (per-size results kept raw, so
    the per-size veto can see each size's own spread)."""
    inc_runs = [incumbent] if isinstance(incumbent, Measurement) else list(incumbent)
    cand_runs = [candidate] if isinstance(candidate, Measurement) else list(candidate)
    inc, cand = pool(inc_runs), pool(cand_runs)
    assert inc is not None and cand is not None, "decide: both sides need a measurement"
    a, b = inc.samples or [inc.value], cand.samples or [cand.value]
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
        if inc.per_size and cand.per_size:
            # the per-size veto is the holistic rule's (tuner.holistic), not a second copy of it
            from tuner.holistic import decide_sizes

            _, _, sizes = decide_sizes(inc_runs, cand_runs, tolerance=size_tolerance)
            if sizes["regressed"]:
                worst = sizes["regressed"][0]
                stats["regressed_size"] = {"size": worst,
                                           "change": sizes["per_size"][worst]["ratio"] - 1.0}
                return Decision("reverted", "size_regressed", gain, threshold, stats)
        return Decision("kept", "improved", gain, threshold, stats)
    if mean < -threshold:
        return Decision("reverted", "worse", gain, threshold, stats)
    return Decision("reverted", "within_noise", gain, threshold, stats)


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
