"""Evaluate a runtime candidate (Candidate.runtime: CUDA graphs, capture sizes, ...) on a
holistic workload: interleaved A/B runs against the incumbent runtime, then the per-size keep
rule (tuner.search.keep). Fits tuner.search.loop's Evaluator protocol (`gates()`, `evaluate()`), so any
proposer can search runtime settings; host knobs go through tuner.search.host.evaluator.HostEvaluator.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from tuner.errors import WorkloadFailed, WorkloadHang
from tuner.search import keep
from tuner.search.ab import AB
from tuner.search.gates import Gate
from tuner.trial import Candidate, GateResult, Measurement, Trial


@dataclass
class RuntimeEvaluator:
    workload: Any  # .configure(runtime), .measure(repeats, timeout_s) -> Measurement
    incumbent: dict[str, Any] = field(default_factory=dict)
    rounds: int = 3  # A/B pairs
    repeats: int = 3  # repeats inside each measurement
    tolerance: float = 0.01
    timeout_s: Optional[float] = None
    validate: Optional[Callable[[dict[str, Any]], Any]] = None  # raises ValueError when invalid
    extra_gates: list[Gate] = field(default_factory=list)  # e.g. tuner.search.gates.policy(...)
    #: micro-benchmark gain of a candidate (e.g. its first-token time), for holistic_lost
    micro: Optional[Callable[[Candidate], Optional[float]]] = None
    seen: set[str] = field(default_factory=set)

    def gates(self) -> list[Gate]:
        return [self._runtime_only, self.valid, *self.extra_gates, self._fresh]

    def _runtime_only(self, c: Candidate) -> GateResult:
        if c.kernel is not None:
            return GateResult(gate="known", passed=False, code="malformed",
                              detail="a kernel candidate sent to the runtime evaluator")
        return GateResult(gate="known", passed=True)

    def valid(self, c: Candidate) -> GateResult:
        """The domain gate: the merged runtime passes `validate`."""
        if self.validate is not None:
            try:
                self.validate({**self.incumbent, **c.runtime})
            except ValueError as e:
                return GateResult(gate="domain", passed=False, code="out_of_domain", detail=str(e))
        return GateResult(gate="domain", passed=True)

    def _fresh(self, c: Candidate) -> GateResult:
        merged = {**self.incumbent, **c.runtime}
        if c.key() in self.seen or (merged == self.incumbent and not c.knobs):
            return GateResult(gate="duplicate", passed=False, code="duplicate",
                              detail="already evaluated or the same as the incumbent")
        return GateResult(gate="duplicate", passed=True)

    def _measure(self, runtime: dict[str, Any]) -> Measurement:
        self.workload.configure(runtime)
        return self.workload.measure(repeats=self.repeats, timeout_s=self.timeout_s)

    def ab(self, cand_rt: dict[str, Any]) -> tuple[list[Measurement], list[Measurement]]:
        """`rounds` pairs (tuner.search.ab), incumbent runtime against `cand_rt`."""
        ab = AB().run(lambda side: self._measure(cand_rt if side == "b" else self.incumbent), self.rounds)
        return ab.a, ab.b

    def evaluate(self, c: Candidate, trial: Trial) -> Trial:
        self.seen.add(c.key())
        cand_rt = {**self.incumbent, **c.runtime}
        micro = self.micro(c) if self.micro else None
        try:
            a, b = self.ab(cand_rt)
        except (WorkloadFailed, WorkloadHang) as e:
            code = "timeout" if isinstance(e, WorkloadHang) else e.code or "measure_failed"
            if "differ from the plain torch path" in str(e):
                code = "incorrect"
            trial.gates.append(GateResult(gate="measure", passed=False, code=code, detail=str(e)))
            trial.verdict, trial.reason = "rejected", code
            return trial
        finally:
            self.workload.configure(self.incumbent)
        keep.gate(a, b, tolerance=self.tolerance, micro_gain=micro, trial=trial)
        if trial.verdict == "kept":
            self.incumbent = cand_rt
        return trial
