"""The keep rule: is the candidate better than the incumbent beyond the measured noise?

Samples come in interleaved A/B pairs (incumbent, candidate) so slow drift (temperature, other
tenants) hits both sides alike. The decision works on log ratios of the pairs, with the noise
taken as the larger of the pairs' own spread and the run's pooled estimate of the workload's
sample-to-sample noise (a handful of pairs underestimates spread too often to trust alone).

Across sizes (`decide_sizes`, and `gate`, its GateResult form): a change earns its place only by
making inference faster overall without making any context length or batch size slower.

    verdict, reason, stats = decide_sizes(incumbent_runs, candidate_runs, tolerance=0.01)

Each argument is a list of `Measurement`s of one side (repeated or interleaved A/B runs of the
holistic workload), each with `per_size` results where higher is better (tokens/s). The rule:

1. per size, the ratio of medians candidate / incumbent, and whether the two sides' repeats
   are separated: the candidate's middle half (interquartile range; full range under 4
   repeats) lies wholly below (or above) the incumbent's;
2. the holistic gain is the geometric mean of those ratios minus one (every size weighs the same
   whatever its absolute tokens/s); it counts only when the headline samples (per repeat, the
   geometric mean over sizes) are separated the same way;
3. reasons, first match wins:
   - `holistic_lost`: the candidate won its micro-benchmark (`micro_gain` > 0) but is slower end
     to end beyond the spread (the CUDA-graphs-off trap);
   - `size_regressed`: some size is slower by more than `tolerance` AND beyond its own spread
     (a drop inside the spread is not a measured regression; raise the repeats to resolve it);
   - `improved` (kept): faster beyond the spread (and by more than `min_gain`);
   - `worse`: slower beyond the spread;
   - `within_noise`: otherwise.
"Beyond the spread" is a separation of the two sides' repeats rather than a difference of
medians compared with one noise figure: it stays honest when one side is far noisier than the
other (a shared host, a preempted run). `stats["noise"]` still reports the larger relative
spread for the record.

Workloads without sizes (one headline metric) go through the same rule with one "size".
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence, Union

from tuner.trial import GateResult, Measurement, Trial
from tuner.workloads.stats import geomean, rel_spread


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
            # the per-size veto is the holistic rule's (decide_sizes below), not a second copy of it
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


def decide_time(time_s: float, incumbent_s: Optional[float],
                ratio_band: Optional[Sequence[float]] = None) -> tuple[str, str]:
    """The keep rule for one kernel config timed by kernelsearch's harness: (verdict, reason).

    Kept ("improved") only when faster than the incumbent config and, where the harness A/B'd
    the two on the same inputs (interleaved rounds), the per-round incumbent/candidate time
    ratios' band ([p25, p75]) lies wholly above 1: faster beyond the spread, the separation
    `decide_sizes` asks of two sides' repeats. Faster inside the spread: "within_noise"."""
    faster = incumbent_s is None or time_s < incumbent_s
    if faster and (ratio_band is None or ratio_band[0] > 1.0):
        return "kept", "improved"
    return ("reverted", "within_noise") if faster else ("reverted", "worse")


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
        per_size_tok_per_j=_median_of(m.per_size_tok_per_j for m in measurements),
        per_size_watts=_median_of(m.per_size_watts for m in measurements),
        per_size_goodput=_median_of(m.per_size_goodput for m in measurements),
        energy_source=first.energy_source,
    )


def _median_of(dicts: Any) -> dict[str, float]:
    """Per key, the median over the dicts that have it (energy per size: a side's repeats)."""
    out: dict[str, list[float]] = {}
    for d in dicts:
        for k, v in d.items():
            out.setdefault(k, []).append(v)
    return {k: statistics.median(v) for k, v in out.items()}


HEADLINE = "__headline__"


def _size_samples(ms: Sequence[Measurement]) -> dict[str, list[float]]:
    """All repeats per size over a side's measurements (raw repeats when the workload kept them
    in extra['per_size_samples'], else each measurement's per-size median)."""
    out: dict[str, list[float]] = {}
    for m in ms:
        raw = (m.extra or {}).get("per_size_samples") or {}
        if m.per_size:
            for k, v in m.per_size.items():
                vals = raw.get(k) or [v]
                out.setdefault(k, []).extend(float(x) for x in vals)
        else:
            out.setdefault(HEADLINE, []).extend(float(x) for x in (m.samples or [m.value]))
    return out


def _headline_samples(ms: Sequence[Measurement]) -> list[float]:
    return [float(s) for m in ms for s in (m.samples or [m.value])]


def _drift(ms: Sequence[Measurement], size: str) -> float:
    """How far one side's measurements of a size differ from each other: max/min - 1 of their
    per-measurement medians (0 with fewer than two)."""
    meds = [float(m.per_size[size]) for m in ms if m.per_size and size in m.per_size]
    return max(meds) / min(meds) - 1.0 if len(meds) >= 2 and min(meds) > 0 else 0.0


def _headline(ms: Sequence[Measurement], per: dict[str, list[float]], common: list[str]) -> list[float]:
    """Per-repeat geometric means over the sizes both sides measured (so a size one side lacks
    cannot tilt the comparison); the measurements' own samples when repeats do not line up."""
    if set(per) == set(common) or len({len(per[k]) for k in common}) != 1:
        return _headline_samples(ms)
    n = len(per[common[0]])
    return [geomean([per[k][i] for k in common]) for i in range(n)]


def decide_sizes(
    incumbent: Sequence[Measurement],
    candidate: Sequence[Measurement],
    tolerance: float = 0.01,
    micro_gain: Optional[float] = None,
    min_gain: float = 0.0,
) -> tuple[str, str, dict[str, Any]]:
    """(verdict "kept"|"reverted", reason code from tuner.trial.REASONS, stats)."""
    if not incumbent or not candidate:
        raise ValueError("decide_sizes: both sides need at least one measurement")
    a, b = _size_samples(incumbent), _size_samples(candidate)
    common = [k for k in a if k in b]
    if not common:
        raise ValueError(f"decide_sizes: no size measured on both sides "
                         f"(incumbent {sorted(a)}, candidate {sorted(b)})")
    sizes: dict[str, dict[str, Any]] = {}
    for k in common:
        ia, cb = statistics.median(a[k]), statistics.median(b[k])
        sizes[k] = {"incumbent": ia, "candidate": cb, "ratio": cb / ia if ia > 0 else 0.0,
                    "spread": max(rel_spread(a[k]), rel_spread(b[k])),
                    "drift": max(_drift(incumbent, k), _drift(candidate, k)),
                    "separated": _separated(a[k], b[k]), "repeats": min(len(a[k]), len(b[k]))}
    gain = geomean([s["ratio"] for s in sizes.values()]) - 1.0
    ha, hb = _headline(incumbent, a, common), _headline(candidate, b, common)
    noise = max(rel_spread(ha), rel_spread(hb))
    sep = _separated(ha, hb)
    # a size regressed: slower beyond the tolerance AND beyond what the same side measured from
    # one measurement to the next (on the H200 a compiled HF prefill's per-measurement medians
    # spread 5% on one side of an A/B while the two sides' interquartile bands did not overlap:
    # a 2.6% "regression" of an unchanged prefill vetoed a 2.5x decode win), and with the
    # repeats' bands apart
    regressed = sorted(
        (k for k, s in sizes.items() if s["ratio"] < 1.0 - max(tolerance, s["drift"])
         and s["separated"] == "below"),
        key=lambda k: sizes[k]["ratio"],
    )
    stats: dict[str, Any] = {
        "gain": gain, "noise": noise, "separated": sep, "tolerance": tolerance,
        "min_gain": min_gain, "micro_gain": micro_gain, "per_size": sizes, "regressed": regressed,
        "missing_sizes": sorted(set(a) ^ set(b)),
        "spread_unknown": min(len(ha), len(hb)) < 2,
    }
    if micro_gain is not None and micro_gain > 0 and gain < 0 and sep == "below":
        return "reverted", "holistic_lost", stats
    if regressed:
        return "reverted", "size_regressed", stats
    if gain > min_gain and sep == "above":
        return "kept", "improved", stats
    if gain < 0 and sep == "below":
        return "reverted", "worse", stats
    return "reverted", "within_noise", stats


def _band(x: Sequence[float]) -> tuple[float, float]:
    """The middle half of the repeats (interquartile range), or the whole range under 4."""
    if len(x) < 4:
        return min(x), max(x)
    q = statistics.quantiles(x, n=4, method="inclusive")
    return q[0], q[2]


def _separated(inc: Sequence[float], cand: Sequence[float]) -> str:
    """'above' / 'below' when the candidate's band lies wholly above / below the incumbent's,
    else 'overlap'."""
    ilo, ihi = _band(inc)
    clo, chi = _band(cand)
    if clo > ihi:
        return "above"
    if chi < ilo:
        return "below"
    return "overlap"


def explain(reason: str, stats: dict[str, Any]) -> str:
    """One line for a GateResult detail or a report."""
    g, n = stats["gain"], stats["noise"]
    if reason == "size_regressed":
        worst = stats["regressed"][0]
        r = stats["per_size"][worst]["ratio"]
        return (f"{worst} regressed {r - 1:+.1%} (tolerance {stats['tolerance']:.0%}); "
                f"holistic {g:+.2%} vs noise {n:.2%}")
    if reason == "holistic_lost":
        return f"micro-benchmark {stats['micro_gain']:+.1%} but end to end {g:+.2%} (noise {n:.2%})"
    return f"holistic {g:+.2%} vs noise {n:.2%}"


def gate(incumbent: Sequence[Measurement], candidate: Sequence[Measurement],
         tolerance: float = 0.01, micro_gain: Optional[float] = None,
         trial: Optional[Trial] = None) -> GateResult:
    """The holistic gate as a GateResult; with `trial`, also records the per-size results,
    objective, incumbent, gain, verdict and reason on it."""
    verdict, reason, stats = decide_sizes(incumbent, candidate, tolerance, micro_gain)
    res = GateResult(gate="holistic", passed=verdict == "kept", code=reason,
                     detail=explain(reason, stats))
    if trial is not None:
        inc_v = statistics.median(_headline_samples(incumbent))
        cand_v = statistics.median(_headline_samples(candidate))
        trial.gates.append(res)
        trial.measurements["holistic"] = {
            "per_size": stats["per_size"], "regressed": stats["regressed"], "gain": stats["gain"],
            "noise": stats["noise"], "tolerance": tolerance, "micro_gain": micro_gain,
            "incumbent": [m.model_dump() for m in incumbent],
            "candidate": [m.model_dump() for m in candidate],
        }
        trial.objective, trial.incumbent, trial.gain = cand_v, inc_v, stats["gain"]
        trial.verdict, trial.reason = verdict, reason  # type: ignore[assignment]
    return res
