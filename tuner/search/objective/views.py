"""The metrics an objective reads from a Measurement, and the projection that lets the keep rule
(tuner.search.keep) run unchanged on any of them: a per-size metric (tokens/J, goodput) becomes
a Measurement shaped like a throughput one (per size, headline samples, raw per-size repeats)."""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from tuner.trial import Measurement
from tuner.workloads.stats import geomean


@dataclass(frozen=True)
class Metric:
    """What an objective maximises: its name and unit as a user reads them, and how to read its
    headline value from one Measurement (None: not measured)."""
    name: str
    unit: str
    read: Callable[[Measurement], Optional[float]]

    def of(self, ms: Sequence[Measurement]) -> Optional[float]:
        """The median over repeats; None when any repeat lacks it."""
        vals = [self.read(m) for m in ms]
        return statistics.median(vals) if vals and all(v is not None for v in vals) else None  # type: ignore[type-var]


def tok_s(m: Measurement) -> Optional[float]:
    return m.value if math.isfinite(m.value) and m.value > 0 else None


def _headline(per: dict[str, float]) -> Optional[float]:
    """The geometric mean over sizes (each size weighs the same, as in the throughput rule)."""
    vals = [v for v in per.values() if math.isfinite(v) and v > 0]
    return geomean(vals) if vals else None


def tok_per_j(m: Measurement) -> Optional[float]:
    """Headline tokens/J; None when nothing was measured."""
    return _headline(m.per_size_tok_per_j)


def goodput(m: Measurement) -> Optional[float]:
    """Headline goodput (requests/s meeting the SLOs); None when the workload reported none.
    Zero is a measurement (no request met the SLOs), so it counts as measured."""
    if not m.per_size_goodput:
        return None
    vals = list(m.per_size_goodput.values())
    if not all(math.isfinite(v) and v >= 0 for v in vals):
        return None
    return geomean([max(v, 1e-9) for v in vals])


def watts(m: Measurement) -> Optional[float]:
    """The highest per-size mean board watts (a budget holds at every size); None when none
    was measured or a reading is not a number."""
    vals = list(m.per_size_watts.values())
    if not vals or not all(math.isfinite(v) and v >= 0 for v in vals):
        return None
    return max(vals)


THROUGHPUT = Metric("throughput", "tok/s", tok_s)
TOK_PER_J = Metric("tokens per joule", "tok/J", tok_per_j)
GOODPUT = Metric("goodput", "req/s", goodput)


def by_throughput_ratio(m: Measurement, per: dict[str, float], value: float,
                        metric: Metric) -> Measurement:
    """The view of `m` whose per-size values are `per`: each size's raw repeats scaled by that
    size's value over its tokens/s, so the repeats keep their own spread (the throughput noise
    an energy reading divides). Used where the metric has no repeats of its own."""
    raw = (m.extra or {}).get("per_size_samples") or {}
    scaled = {k: [x * per[k] / m.per_size[k] for x in raw[k]]
              for k in per if raw.get(k) and m.per_size.get(k, 0) > 0}
    f = value / m.value if m.value > 0 else 0.0
    return Measurement(metric=metric.name, unit=metric.unit, value=value,
                       samples=[s * f for s in (m.samples or [m.value])], per_size=per,
                       extra={"per_size_samples": scaled} if scaled else {})


def project_energy(m: Measurement) -> Measurement:
    """The tokens/J view of a measurement."""
    hj = tok_per_j(m)
    if hj is None:
        raise ValueError("project: no energy measured")
    per = {k: v for k, v in m.per_size_tok_per_j.items() if k in m.per_size}
    return by_throughput_ratio(m, per, hj, TOK_PER_J)


def project_goodput(m: Measurement) -> Measurement:
    """The goodput view of a measurement: per size its goodput; its repeats where the workload
    kept them (extra["per_size_goodput_samples"]), else the goodput once. The headline samples
    are the per-repeat geometric means over sizes where every size has that repeat."""
    g = goodput(m)
    if g is None:
        raise ValueError("project: no goodput measured")
    per = {k: max(v, 1e-9) for k, v in m.per_size_goodput.items()}
    reps = {k: [max(float(x), 1e-9) for x in v]
            for k, v in ((m.extra or {}).get("per_size_goodput_samples") or {}).items()
            if k in per and isinstance(v, list) and v}
    n = min((len(v) for v in reps.values()), default=0)
    samples = [geomean([reps[k][i] for k in per]) for i in range(n)] \
        if n and set(reps) == set(per) else [g]
    return Measurement(metric=GOODPUT.name, unit=GOODPUT.unit, value=g, samples=samples,
                       per_size=per, extra={"per_size_samples": reps} if reps else {})


def size_watts(ms: Sequence[Measurement]) -> dict[str, float]:
    """Per size, the median over repeats of the board watts. A reading that is not a finite
    non-negative number counts as the worst (inf): it is never within a budget."""
    out: dict[str, list[float]] = {}
    for m in ms:
        for k, w in m.per_size_watts.items():
            out.setdefault(k, []).append(w if math.isfinite(w) and w >= 0 else math.inf)
    return {k: statistics.median(v) for k, v in out.items()}
