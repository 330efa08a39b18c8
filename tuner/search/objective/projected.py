"""An objective on another view of each measurement (tokens/J, goodput): the keep rule runs
unchanged on the projected sides (the same separation test against the noise, the same
`size_regressed` and `holistic_lost` vetoes, per size); `after` adds the objective's own
conditions (the energy floor)."""
from __future__ import annotations

import statistics
from typing import Any, ClassVar, Optional, Sequence

from tuner.search import keep
from tuner.search.objective.base import Objective
from tuner.trial import Measurement


class Projected(Objective):
    unit_name: ClassVar[str] = ""  # how `explain` names the metric ("tokens/J")

    def project(self, m: Measurement) -> Measurement:
        raise NotImplementedError

    def after(self, verdict: str, reason: str, stats: dict[str, Any],
              incumbent: Sequence[Measurement], candidate: Sequence[Measurement],
              anchor: Optional[dict[str, float]]) -> tuple[str, str, dict[str, Any]]:
        return verdict, reason, {**stats, "objective": self.name}

    def decide_sizes(self, incumbent: Sequence[Measurement], candidate: Sequence[Measurement],
                     tolerance: float = 0.01, micro_gain: Optional[float] = None,
                     anchor: Optional[dict[str, float]] = None) -> tuple[str, str, dict[str, Any]]:
        if not (self.measured(incumbent) and self.measured(candidate)):
            _, _, stats = keep.decide_sizes(incumbent, candidate, tolerance, micro_gain)
            return "reverted", self.unmeasured, {**stats, "objective": self.name}
        verdict, reason, stats = keep.decide_sizes([self.project(m) for m in incumbent],
                                                   [self.project(m) for m in candidate],
                                                   tolerance, micro_gain)
        return self.after(verdict, reason, stats, incumbent, candidate, anchor)

    def decide(self, incumbent: Sequence[Measurement], candidate: Sequence[Measurement],
               pooled_noise: float = 0.0, z: float = 2.0,
               anchor: Optional[dict[str, float]] = None) -> keep.Decision:
        if not (self.measured(incumbent) and self.measured(candidate)):
            return keep.Decision("reverted", self.unmeasured, 0.0, 0.0, {"objective": self.name})
        d = keep.decide([self.project(m) for m in incumbent], [self.project(m) for m in candidate],
                        pooled_noise=pooled_noise, z=z)
        verdict, reason, stats = self.after(d.verdict, d.reason, {**d.stats, "gain": d.gain},
                                            incumbent, candidate, anchor)
        return keep.Decision(verdict, reason, d.gain, d.threshold, stats)

    def score(self, candidate: Sequence[Measurement], reason: str,
              stats: dict[str, Any]) -> Optional[float]:
        vals = [self.metric.read(m) for m in candidate]
        return statistics.median(vals) if vals and all(v is not None for v in vals) else None  # type: ignore[type-var]

    def explain(self, reason: str, stats: dict[str, Any]) -> str:
        if reason == self.unmeasured:
            return f"a side measured no {self.needs}"
        return f"{self.unit_name} " + keep.explain(reason, stats).removeprefix("holistic ")
