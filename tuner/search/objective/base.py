"""The objective's interface: its metric, its keep rule (decide / decide_sizes / gate / score /
explain) and its gates before anything is applied (budget_gate, within_budget). Each objective
is one small class (tuner.search.objective.*), registered by name in
tuner/search/objective/__init__.py; the searches hold one object and never branch on its name."""
from __future__ import annotations

from typing import Any, Callable, ClassVar, Optional, Sequence

from pydantic import BaseModel, ConfigDict

from tuner.search import keep
from tuner.search.objective.views import THROUGHPUT, Metric
from tuner.trial import Candidate, GateResult, Measurement, Trial


class Objective(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: ClassVar[str]
    help: ClassVar[str]  # one line: what it keeps (the --objective help)
    metric: ClassVar[Metric] = THROUGHPUT
    #: the reason a side that lacks the metric is refused with (tuner.trial.REASONS)
    unmeasured: ClassVar[str] = "measure_failed"
    #: what a workload must measure for this objective ("" for tokens/s, which every one does)
    needs: ClassVar[str] = ""
    #: the --flags this objective takes (field name -> flag), for usage errors
    flags: ClassVar[dict[str, str]] = {}

    # -- what it is ------------------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        """For provenance, run metadata and the summaries: the name and its own parameters."""
        return {"objective": self.name, **self.model_dump()}

    def value(self, ms: Sequence[Measurement]) -> Optional[float]:
        """The objective's metric over a side's repeats (None: not measured)."""
        return self.metric.of(ms)

    def measured(self, ms: Sequence[Measurement]) -> bool:
        return bool(ms) and self.value(ms) is not None

    def require(self, m: Measurement, workload: str) -> None:
        """Up front, on the workload's first measurement: a ValueError naming what is missing
        when it does not measure this objective's metric (no trial is spent finding out)."""
        if self.needs and self.metric.read(m) is None:
            raise ValueError(f"--objective {self.name}: workload {workload} measures no "
                             f"{self.needs} ({self.metric.unit}); use a workload that does, or "
                             "--objective throughput")

    # -- the keep rule ---------------------------------------------------------------------------
    def decide_sizes(self, incumbent: Sequence[Measurement], candidate: Sequence[Measurement],
                     tolerance: float = 0.01, micro_gain: Optional[float] = None,
                     anchor: Optional[dict[str, float]] = None) -> tuple[str, str, dict[str, Any]]:
        """`keep.decide_sizes` under this objective: (verdict, reason, stats). `anchor`: per
        size, the incumbent's throughput over the run's start (`compound`)."""
        return keep.decide_sizes(incumbent, candidate, tolerance, micro_gain)

    def decide(self, incumbent: Sequence[Measurement], candidate: Sequence[Measurement],
               pooled_noise: float = 0.0, z: float = 2.0,
               anchor: Optional[dict[str, float]] = None) -> keep.Decision:
        """`keep.decide` (the host evaluator's rule: pairs' log ratios against the pooled
        noise) under this objective."""
        return keep.decide(incumbent, candidate, pooled_noise=pooled_noise, z=z)

    def score(self, candidate: Sequence[Measurement], reason: str,
              stats: dict[str, Any]) -> Optional[float]:
        """The candidate's value, what proposers learn (`trial.objective`): never the raw win
        of a refused candidate, so a sampler does not chase it."""
        pooled = keep.pool(list(candidate))
        return None if pooled is None else pooled.value

    def explain(self, reason: str, stats: dict[str, Any]) -> str:
        return keep.explain(reason, stats)

    def own_reason(self, reason: str) -> bool:
        """Whether `reason` is this objective's own (its explanation says more than the gain)."""
        return reason == self.unmeasured

    def gate(self, incumbent: Sequence[Measurement], candidate: Sequence[Measurement],
             tolerance: float = 0.01, micro_gain: Optional[float] = None,
             trial: Optional[Trial] = None, anchor: Optional[dict[str, float]] = None) -> GateResult:
        """`keep.gate` under this objective (the same record on the trial, plus its fields)."""
        verdict, reason, stats = self.decide_sizes(incumbent, candidate, tolerance, micro_gain, anchor)
        res = GateResult(gate="holistic", passed=verdict == "kept", code=reason,
                         detail=self.explain(reason, stats))
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
            trial.objective = self.score(candidate, reason, stats)
            trial.incumbent = self.score(incumbent, "baseline", {})
            trial.gain = stats.get("gain")
            trial.verdict, trial.reason = verdict, reason  # type: ignore[assignment]
        return res

    def compound(self, anchor: dict[str, float], stats: dict[str, Any]) -> None:
        """After a keep: the new incumbent's throughput over the run's start, per size (in place)."""
        for k, r in (stats.get("throughput_ratio") or {}).items():
            anchor[k] = anchor.get(k, 1.0) * r

    def summary(self, start: Sequence[Measurement], kept: Sequence[Measurement]) -> dict[str, Any]:
        """The run's start and its kept settings in the objective's metric and in tokens/s
        (what `search host|mixed` print at the end)."""
        unit = next((m.unit for m in start if m.unit), "") or THROUGHPUT.unit
        return {"objective": self.name, "metric": self.metric.name, "unit": self.metric.unit,
                "start": self.value(start), "kept": self.value(kept),
                "throughput": {"unit": unit, "start": THROUGHPUT.of(start),
                               "kept": THROUGHPUT.of(kept)}}

    # -- a kernel config timed by the judge --------------------------------------------------------
    #: what `kernel_cost` is, as the kernel search's summary shows it: (name, unit, scale)
    kernel_metric: ClassVar[tuple[str, str, float]] = ("time a call", "us", 1e6)

    def kernel_summary(self, first: Optional[dict[str, Any]],
                       best: Optional[dict[str, Any]]) -> dict[str, Any]:
        """A bucket's first measured config and its kept one, in the objective's kernel cost
        and in time a call (`search kernel` prints both)."""
        name, unit, scale = self.kernel_metric

        def cost(r: Optional[dict[str, Any]]) -> Optional[float]:
            c = self.kernel_cost(r) if r else None
            return c * scale if c else None

        def us(r: Optional[dict[str, Any]]) -> Optional[float]:
            return r["time_s"] * 1e6 if r and r.get("time_s") else None

        return {"objective": self.name, "metric": name, "unit": unit, "start": cost(first),
                "kept": cost(best), "time_us": {"start": us(first), "kept": us(best)}}

    def kernel_cost(self, res: dict[str, Any]) -> Optional[float]:
        """What a kernel search minimises for one judged config (lower is better): its time a
        call; None when not measured."""
        return res.get("time_s") or None

    def kernel_band(self, res: dict[str, Any]) -> Optional[Any]:
        """The judge's interleaved A/B band of incumbent/candidate time ([p25, p75] per round),
        where the cost is a time; None where it is not (joules are read once a window)."""
        return res.get("vs_incumbent")

    def kernel_refusal(self, res: dict[str, Any]) -> Optional[str]:
        """A reason a measured kernel config is refused whatever its cost, or None."""
        return None

    def kernel_ok(self, device: str) -> Optional[str]:
        """Why a kernel search on `device` cannot measure this objective (None: it can)."""
        return None

    # -- before anything is applied ----------------------------------------------------------------
    def within_budget(self, name: str, value: Any) -> bool:
        """Whether a knob value may be proposed (the search space drops the rest)."""
        return True

    def budget_gate(self, incumbent: Callable[[], dict[str, Any]]) -> Callable[[Candidate], GateResult]:
        def check(c: Candidate) -> GateResult:
            return GateResult(gate="power_budget", passed=True)
        return check
