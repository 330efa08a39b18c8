"""What a search keeps: the objective (`--objective`), applied by the keep rule per size.

- `throughput` (default, the rule as it always was): most tokens/s (`tuner.search.keep`).
- `energy`: most tokens per joule. The keep rule runs unchanged on the tokens/J view of each
  side (`project`): the same separation test against the noise, the same `size_regressed` and
  `holistic_lost` vetoes, per size. A winner is then also held to a floor: at every size its
  median tokens/s must be at least `throughput_floor` (default 0.95) of the run's start (not the
  incumbent's: kept 4% losses cannot add up), else `below_throughput_floor`.
- `power-capped`: most tokens/s with mean board watts <= `power_budget_w` at every size. A
  candidate over the budget is `over_power_budget` (before it is applied, where its power limit
  already says so: `budget_gate`); a candidate within it against an incumbent over it is
  `power_budget_met`; otherwise the throughput rule.

Why energy has a floor: with tokens/J alone the best setting is often a very low clock that
halves throughput (Zeus, NSDI'23: the energy-optimal GPU power limit of a training job is far
below the time-optimal one); the datacentre wants energy saved at "a few percent" of throughput
(Perseus, SOSP'24), not at any cost.
"""
from __future__ import annotations

import fnmatch
import statistics
from typing import Any, Callable, Literal, Optional, Sequence

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tuner.search import keep
from tuner.trial import Candidate, GateResult, Measurement, Trial
from tuner.workloads.stats import geomean

NAMES = ("throughput", "energy", "power-capped")
Name = Literal["throughput", "energy", "power-capped"]
DEFAULT_FLOOR = 0.95
POWER_LIMIT_KNOBS = "gpu*.power_limit_w"


class Objective(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    name: Name = "throughput"
    throughput_floor: float = Field(DEFAULT_FLOOR, gt=0, le=1)
    power_budget_w: Optional[float] = Field(None, gt=0)

    @model_validator(mode="after")
    def _budget(self) -> "Objective":
        if self.name == "power-capped" and self.power_budget_w is None:
            raise ValueError("--power-budget: required with --objective power-capped")
        return self

    @classmethod
    def of(cls, opts: Any) -> "Objective":
        """From a search's options (tuner.search.options: objective, throughput_floor,
        power_budget_w; absent fields take the defaults)."""
        floor = getattr(opts, "throughput_floor", None)
        return cls(name=getattr(opts, "objective", None) or "throughput",
                   throughput_floor=DEFAULT_FLOOR if floor is None else floor,
                   power_budget_w=getattr(opts, "power_budget_w", None))

    def describe(self) -> dict[str, Any]:
        """For provenance and run metadata."""
        d: dict[str, Any] = {"objective": self.name}
        if self.name == "energy":
            d["throughput_floor"] = self.throughput_floor
        if self.name == "power-capped":
            d["power_budget_w"] = self.power_budget_w
        return d


THROUGHPUT = Objective()
#: the reasons this module adds to the keep rule's (tuner.trial.REASONS)
OWN_REASONS = ("below_throughput_floor", "over_power_budget", "power_budget_met", "energy_unmeasured")


# -- energy views of a measurement ---------------------------------------------------------------

def tok_per_j(m: Measurement) -> Optional[float]:
    """Headline tokens/J: the geometric mean over sizes (each size weighs the same, as in the
    throughput rule); None when nothing was measured."""
    vals = [v for v in m.per_size_tok_per_j.values() if v > 0]
    return geomean(vals) if vals else None


def watts(m: Measurement) -> Optional[float]:
    """The highest per-size mean board watts (a budget holds at every size)."""
    return max(m.per_size_watts.values()) if m.per_size_watts else None


def project(m: Measurement) -> Measurement:
    """The tokens/J view of a measurement, shaped like a throughput one (per size, headline
    samples, raw per-size repeats), so `keep` runs on it unchanged. Each size's repeats are
    scaled by that size's tokens/J over its tokens/s (its mean joules per second): the repeats
    keep their own spread, which is the throughput noise the energy reading divides."""
    hj = tok_per_j(m)
    if hj is None:
        raise ValueError("project: no energy measured")
    per = {k: v for k, v in m.per_size_tok_per_j.items() if k in m.per_size}
    raw = (m.extra or {}).get("per_size_samples") or {}
    scaled = {k: [x * per[k] / m.per_size[k] for x in raw[k]]
              for k in per if raw.get(k) and m.per_size[k] > 0}
    f = hj / m.value if m.value > 0 else 0.0
    return Measurement(metric="tok_per_j", unit="tok/J", value=hj,
                       samples=[s * f for s in (m.samples or [m.value])], per_size=per,
                       extra={"per_size_samples": scaled} if scaled else {})


def has_energy(ms: Sequence[Measurement]) -> bool:
    return bool(ms) and all(tok_per_j(m) is not None for m in ms)


def _size_watts(ms: Sequence[Measurement]) -> dict[str, float]:
    out: dict[str, list[float]] = {}
    for m in ms:
        for k, w in m.per_size_watts.items():
            out.setdefault(k, []).append(w)
    return {k: statistics.median(v) for k, v in out.items()}


def _over(ms: Sequence[Measurement], budget: float) -> dict[str, float]:
    return {k: w for k, w in _size_watts(ms).items() if w > budget}


# -- the keep rule under an objective -------------------------------------------------------------

def decide_sizes(obj: Objective, incumbent: Sequence[Measurement], candidate: Sequence[Measurement],
                 tolerance: float = 0.01, micro_gain: Optional[float] = None,
                 anchor: Optional[dict[str, float]] = None) -> tuple[str, str, dict[str, Any]]:
    """`keep.decide_sizes` under `obj`: (verdict, reason, stats). `anchor`: per size, the
    incumbent's throughput over the run's start (`compound`); the floor holds against the start,
    so a chain of kept 4% losses cannot add up to 20%."""
    if obj.name == "throughput":
        return keep.decide_sizes(incumbent, candidate, tolerance, micro_gain)
    if obj.name == "power-capped":
        assert obj.power_budget_w is not None
        stats: dict[str, Any]
        verdict, reason, stats = keep.decide_sizes(incumbent, candidate, tolerance, micro_gain)
        return _capped(obj.power_budget_w, incumbent, candidate, verdict, reason, stats)
    if not (has_energy(incumbent) and has_energy(candidate)):
        _, _, stats = keep.decide_sizes(incumbent, candidate, tolerance, micro_gain)
        return "reverted", "energy_unmeasured", {**stats, "objective": obj.name}
    verdict, reason, stats = keep.decide_sizes([project(m) for m in incumbent],
                                               [project(m) for m in candidate], tolerance, micro_gain)
    _, _, thr = keep.decide_sizes(incumbent, candidate, tolerance)
    return _floor(obj, verdict, reason, stats, {k: s["ratio"] for k, s in thr["per_size"].items()},
                  anchor)


def decide(obj: Objective, incumbent: Sequence[Measurement], candidate: Sequence[Measurement],
           pooled_noise: float = 0.0, z: float = 2.0,
           anchor: Optional[dict[str, float]] = None) -> keep.Decision:
    """`keep.decide` (the host evaluator's rule: pairs' log ratios against the pooled noise)
    under `obj`."""
    if obj.name == "throughput":
        return keep.decide(incumbent, candidate, pooled_noise=pooled_noise, z=z)
    if obj.name == "power-capped":
        assert obj.power_budget_w is not None
        d = keep.decide(incumbent, candidate, pooled_noise=pooled_noise, z=z)
        verdict, reason, stats = _capped(obj.power_budget_w, incumbent, candidate,
                                         d.verdict, d.reason, {**d.stats, "gain": d.gain})
        return keep.Decision(verdict, reason, d.gain, d.threshold, stats)
    if not (has_energy(incumbent) and has_energy(candidate)):
        return keep.Decision("reverted", "energy_unmeasured", 0.0, 0.0, {"objective": obj.name})
    d = keep.decide([project(m) for m in incumbent], [project(m) for m in candidate],
                    pooled_noise=pooled_noise, z=z)
    ratios = _throughput_ratios(incumbent, candidate)
    verdict, reason, stats = _floor(obj, d.verdict, d.reason, {**d.stats, "gain": d.gain}, ratios,
                                    anchor)
    return keep.Decision(verdict, reason, d.gain, d.threshold, stats)


def _throughput_ratios(a: Sequence[Measurement], b: Sequence[Measurement]) -> dict[str, float]:
    pa, pb = keep.pool(list(a)), keep.pool(list(b))
    assert pa is not None and pb is not None
    if pa.per_size and pb.per_size:
        return {k: pb.per_size[k] / v for k, v in pa.per_size.items() if k in pb.per_size and v > 0}
    return {keep.HEADLINE: pb.value / pa.value if pa.value > 0 else 0.0}


def _floor(obj: Objective, verdict: str, reason: str, stats: dict[str, Any],
           ratios: dict[str, float], anchor: Optional[dict[str, float]] = None,
           ) -> tuple[str, str, dict[str, Any]]:
    vs_start = {k: r * (anchor or {}).get(k, 1.0) for k, r in ratios.items()}
    below = sorted((k for k, r in vs_start.items() if r < obj.throughput_floor), key=vs_start.__getitem__)
    stats = {**stats, "objective": obj.name, "throughput_ratio": ratios, "vs_start": vs_start,
             "throughput_floor": obj.throughput_floor, "below_floor": below}
    if verdict == "kept" and below:
        return "reverted", "below_throughput_floor", stats
    return verdict, reason, stats


def _capped(budget: float, a: Sequence[Measurement], b: Sequence[Measurement], verdict: str,
            reason: str, stats: dict[str, Any]) -> tuple[str, str, dict[str, Any]]:
    over_b, over_a = _over(b, budget), _over(a, budget)
    stats = {**stats, "objective": "power-capped", "power_budget_w": budget,
             "candidate_watts": _size_watts(b), "incumbent_watts": _size_watts(a)}
    if not any(m.per_size_watts for m in b):
        return "reverted", "energy_unmeasured", stats
    if over_b:
        return "reverted", "over_power_budget", {**stats, "over_budget": over_b}
    if over_a and reason not in ("holistic_lost",):
        return "kept", "power_budget_met", stats
    return verdict, reason, stats


def score(obj: Objective, candidate: Sequence[Measurement], reason: str,
          stats: dict[str, Any]) -> Optional[float]:
    """The candidate's value under `obj`, what proposers learn (`trial.objective`): tokens/J
    (penalised by how far below the floor its throughput fell) or tokens/s (scaled down by how
    far over the budget it drew). Never the raw win of a refused candidate, so a sampler does
    not chase it."""
    pooled = keep.pool(list(candidate))
    if pooled is None:
        return None
    if obj.name == "energy":
        vals = [tok_per_j(m) for m in candidate]
        tj = statistics.median([v for v in vals if v is not None]) if all(vals) else None
        if tj is None:
            return None
        worst = min((stats.get("vs_start") or {1: 1.0}).values())
        return tj * min(1.0, worst / obj.throughput_floor) ** 4
    v = pooled.value
    if obj.name == "power-capped" and reason == "over_power_budget":
        w = max(_size_watts(candidate).values())
        return v * (obj.power_budget_w or w) / w / 2
    return v


def explain(obj: Objective, reason: str, stats: dict[str, Any]) -> str:
    if reason == "below_throughput_floor":
        k = stats["below_floor"][0]
        return (f"tokens/J {stats['gain']:+.2%} but {k} at {stats['vs_start'][k]:.1%} "
                f"of the start's tokens/s (floor {stats['throughput_floor']:.0%})")
    if reason == "over_power_budget":
        k, w = max(stats["over_budget"].items(), key=lambda kv: kv[1])
        return f"{k} drew {w:.0f} W, over the {stats['power_budget_w']:.0f} W budget"
    if reason == "power_budget_met":
        return f"within the {stats['power_budget_w']:.0f} W budget; the incumbent was over it"
    if reason == "energy_unmeasured":
        return "a side measured no energy"
    what = "tokens/J" if obj.name == "energy" else "holistic"
    return f"{what} " + keep.explain(reason, stats).removeprefix("holistic ")


def gate(obj: Objective, incumbent: Sequence[Measurement], candidate: Sequence[Measurement],
         tolerance: float = 0.01, micro_gain: Optional[float] = None,
         trial: Optional[Trial] = None, anchor: Optional[dict[str, float]] = None) -> GateResult:
    """`keep.gate` under `obj` (the same record on the trial, plus the objective's fields)."""
    if obj.name == "throughput":
        return keep.gate(incumbent, candidate, tolerance, micro_gain, trial)
    verdict, reason, stats = decide_sizes(obj, incumbent, candidate, tolerance, micro_gain, anchor)
    res = GateResult(gate="holistic", passed=verdict == "kept", code=reason,
                     detail=explain(obj, reason, stats))
    if trial is not None:
        trial.gates.append(res)
        trial.measurements["holistic"] = {
            "per_size": stats.get("per_size"), "regressed": stats.get("regressed"),
            "gain": stats.get("gain"), "noise": stats.get("noise"), "tolerance": tolerance,
            "micro_gain": micro_gain, **{k: stats[k] for k in (
                "objective", "throughput_ratio", "vs_start", "throughput_floor", "below_floor",
                "power_budget_w", "candidate_watts", "incumbent_watts") if k in stats},
            "incumbent": [m.model_dump() for m in incumbent],
            "candidate": [m.model_dump() for m in candidate],
        }
        trial.objective = score(obj, candidate, reason, stats)
        trial.incumbent = score(obj, incumbent, "baseline", {})
        trial.gain = stats.get("gain")
        trial.verdict, trial.reason = verdict, reason  # type: ignore[assignment]
    return res


def compound(anchor: dict[str, float], stats: dict[str, Any]) -> None:
    """After a keep: the new incumbent's throughput over the run's start, per size (in place)."""
    for k, r in (stats.get("throughput_ratio") or {}).items():
        anchor[k] = anchor.get(k, 1.0) * r


# -- before anything is applied --------------------------------------------------------------------

def budget_gate(obj: Objective, incumbent: Callable[[], dict[str, Any]]) -> Callable[[Candidate], GateResult]:
    """power-capped: refuse (`over_power_budget`) a candidate that would leave any GPU's power
    limit above the budget, before it is applied: a limit at or under the budget is what makes
    the board's draw stay under it (the GPU's own power controller enforces the limit)."""
    def check(c: Candidate) -> GateResult:
        if obj.name != "power-capped" or obj.power_budget_w is None:
            return GateResult(gate="power_budget", passed=True)
        merged = {**incumbent(), **c.knobs}
        over = {n: v for n, v in merged.items() if fnmatch.fnmatchcase(n, POWER_LIMIT_KNOBS)
                and isinstance(v, (int, float)) and v > obj.power_budget_w}
        if over:
            n, v = sorted(over.items())[0]
            return GateResult(gate="power_budget", passed=False, code="over_power_budget",
                              detail=f"{n}={v:g} W is over the {obj.power_budget_w:g} W budget")
        return GateResult(gate="power_budget", passed=True)
    return check


def within_budget(obj: Objective, name: str, value: Any) -> bool:
    """Whether a knob value may be proposed under `obj` (the search space drops the rest)."""
    if obj.name != "power-capped" or obj.power_budget_w is None:
        return True
    if not fnmatch.fnmatchcase(name, POWER_LIMIT_KNOBS) or not isinstance(value, (int, float)):
        return True
    return value <= obj.power_budget_w
