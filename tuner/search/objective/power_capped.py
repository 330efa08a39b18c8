"""`--objective power-capped`: most tokens/s with every board's mean watts <= `power_budget_w`
at every size (Zeus's power-limit constraint). A candidate over the budget is
`over_power_budget` (before it is applied, where a power limit already says so:
`budget_gate`); a candidate within it against an incumbent over it is `power_budget_met`, but
only if it keeps tokens per watt: at every size its tokens/s at least `throughput_floor` of
the incumbent's scaled to the budget (incumbent tok/s x budget / incumbent W; throughput falls
slower than power, so an honest in-budget setting clears it and a much slower one does not,
`below_throughput_floor`). Otherwise the throughput rule.

The watts are per board: a measurement's `extra["per_board_watts"]` (board -> W) where the
workload reports it, else its per-size mean. A reading that is not a finite non-negative number
is never within the budget."""
from __future__ import annotations

import fnmatch
import math
from typing import Any, Callable, Optional, Sequence

from pydantic import Field

from tuner.search import keep
from tuner.search.objective.base import Objective
from tuner.search.objective.energy import DEFAULT_FLOOR, throughput_ratios
from tuner.search.objective.views import size_watts
from tuner.trial import Candidate, GateResult, Measurement

POWER_LIMIT_KNOBS = "gpu*.power_limit_w"


def board_watts(ms: Sequence[Measurement]) -> dict[str, float]:
    """Per size, the hottest board's watts (median over repeats): the per-board readings where
    the workload gives them (applied to every size it measured), else the per-size mean."""
    out = size_watts(ms)
    hottest = [max((w if isinstance(w, (int, float)) and math.isfinite(w) and w >= 0 else math.inf)
                   for w in b.values())
               for m in ms if isinstance(b := (m.extra or {}).get("per_board_watts"), dict) and b]
    if hottest:
        worst = sorted(hottest)[len(hottest) // 2]
        return {k: max(v, worst) for k, v in out.items()} or {"all": worst}
    return out


class PowerCapped(Objective):
    name = "power-capped"
    help = ("most tokens/s with every GPU's power limit and measured watts <= --power-budget W "
            "(required)")
    unmeasured = "energy_unmeasured"
    needs = "power"
    flags = {"power_budget_w": "--power-budget", "throughput_floor": "--throughput-floor"}

    power_budget_w: float = Field(gt=0)
    throughput_floor: float = Field(DEFAULT_FLOOR, gt=0, le=1)

    def require(self, m: Measurement, workload: str) -> None:
        if not board_watts([m]):
            raise ValueError(f"--objective {self.name}: workload {workload} measures no power "
                             "(W); use a workload that does, or --objective throughput")

    def measured(self, ms: Sequence[Measurement]) -> bool:
        return any(m.per_size_watts for m in ms)

    def decide_sizes(self, incumbent: Sequence[Measurement], candidate: Sequence[Measurement],
                     tolerance: float = 0.01, micro_gain: Optional[float] = None,
                     anchor: Optional[dict[str, float]] = None) -> tuple[str, str, dict[str, Any]]:
        verdict, reason, stats = keep.decide_sizes(incumbent, candidate, tolerance, micro_gain)
        return self._capped(incumbent, candidate, verdict, reason, stats)

    def decide(self, incumbent: Sequence[Measurement], candidate: Sequence[Measurement],
               pooled_noise: float = 0.0, z: float = 2.0,
               anchor: Optional[dict[str, float]] = None) -> keep.Decision:
        d = keep.decide(incumbent, candidate, pooled_noise=pooled_noise, z=z)
        verdict, reason, stats = self._capped(incumbent, candidate, d.verdict, d.reason,
                                              {**d.stats, "gain": d.gain})
        return keep.Decision(verdict, reason, d.gain, d.threshold, stats)

    def _capped(self, a: Sequence[Measurement], b: Sequence[Measurement], verdict: str,
                reason: str, stats: dict[str, Any]) -> tuple[str, str, dict[str, Any]]:
        budget = self.power_budget_w
        wa, wb = board_watts(a), board_watts(b)
        stats = {**stats, "objective": self.name, "power_budget_w": budget,
                 "candidate_watts": wb, "incumbent_watts": wa}
        if not self.measured(b):
            return "reverted", self.unmeasured, stats
        over_b = {k: w for k, w in wb.items() if not w <= budget}  # NaN/inf: over
        if over_b:
            return "reverted", "over_power_budget", {**stats, "over_budget": over_b}
        over_a = {k: w for k, w in wa.items() if not w <= budget}
        if over_a and reason != "holistic_lost":
            # within the budget at the incumbent's cost in tokens per watt, at most the floor
            ratios = throughput_ratios(a, b)
            hot = max(over_a.values())
            need = {k: self.throughput_floor * budget / hot if math.isfinite(hot) else 0.0
                    for k in ratios}
            below = sorted((k for k, r in ratios.items() if r < need[k]), key=ratios.__getitem__)
            stats = {**stats, "throughput_ratio": ratios, "vs_start": ratios,
                     "throughput_floor": self.throughput_floor, "below_floor": below,
                     "needed_ratio": need}
            if below:
                return "reverted", "below_throughput_floor", stats
            return "kept", "power_budget_met", stats
        return verdict, reason, stats

    def score(self, candidate: Sequence[Measurement], reason: str,
              stats: dict[str, Any]) -> Optional[float]:
        """Tokens/s, scaled down by how far over the budget it drew."""
        v = super().score(candidate, reason, stats)
        if v is not None and reason == "over_power_budget":
            w = max(board_watts(candidate).values())
            return v * self.power_budget_w / w / 2 if math.isfinite(w) and w > 0 else 0.0
        return v

    def own_reason(self, reason: str) -> bool:
        return reason in (self.unmeasured, "over_power_budget", "power_budget_met",
                          "below_throughput_floor")

    def explain(self, reason: str, stats: dict[str, Any]) -> str:
        if reason == "over_power_budget":
            k, w = max(stats["over_budget"].items(), key=lambda kv: kv[1])
            return f"{k} drew {w:.0f} W, over the {stats['power_budget_w']:.0f} W budget"
        if reason == "power_budget_met":
            return f"within the {stats['power_budget_w']:.0f} W budget; the incumbent was over it"
        if reason == "below_throughput_floor":
            k = stats["below_floor"][0]
            return (f"within the {stats['power_budget_w']:.0f} W budget but {k} at "
                    f"{stats['throughput_ratio'][k]:.1%} of the incumbent's tokens/s (needed "
                    f"{stats['needed_ratio'][k]:.1%}: --throughput-floor x budget / its watts)")
        if reason == self.unmeasured:
            return "the candidate measured no power"
        return keep.explain(reason, stats)

    # -- a kernel config: watts = joules a call / seconds a call ------------------------------------
    def kernel_refusal(self, res: dict[str, Any]) -> Optional[str]:
        w = res.get("mean_w")
        if not isinstance(w, (int, float)) or not math.isfinite(w) or w < 0:
            return self.unmeasured
        return "over_power_budget" if w > self.power_budget_w else None

    def kernel_ok(self, device: str) -> Optional[str]:
        return None if device == "cuda" else \
            f"--objective {self.name}: a kernel search on {device} measures no power (NVML is on a GPU)"

    # -- before anything is applied -------------------------------------------------------------
    def within_budget(self, name: str, value: Any) -> bool:
        if not fnmatch.fnmatchcase(name, POWER_LIMIT_KNOBS) or not isinstance(value, (int, float)):
            return True
        return value <= self.power_budget_w

    def budget_gate(self, incumbent: Callable[[], dict[str, Any]]) -> Callable[[Candidate], GateResult]:
        """Refuse (`over_power_budget`) a candidate that would leave any GPU's power limit above
        the budget, before it is applied: a limit at or under the budget is what makes the
        board's draw stay under it (the GPU's own power controller enforces the limit)."""
        def check(c: Candidate) -> GateResult:
            merged = {**incumbent(), **c.knobs}
            over = {n: v for n, v in merged.items() if not self.within_budget(n, v)}
            if over:
                n, v = sorted(over.items())[0]
                return GateResult(gate="power_budget", passed=False, code="over_power_budget",
                                  detail=f"{n}={v:g} W is over the {self.power_budget_w:g} W budget")
            return GateResult(gate="power_budget", passed=True)
        return check
