"""Evaluate a host candidate: apply it inside a safety transaction, measure it against the
incumbent with interleaved A/B repeats under the health monitors, then keep (confirm) or restore
(roll back). Instability during the measurement rolls back at once and quarantines the candidate.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from tuner.errors import OperationFailed, WorkloadFailed, WorkloadHang
from tuner.knobs.base import Knob, values_equal
from tuner.search import gates as G
from tuner.search import keep
from tuner.search import objective as O
from tuner.search.ab import AB
from tuner.trial import Candidate, GateResult, Measurement, Trial


@dataclass
class HostEvaluator:
    knobs: dict[str, Knob]
    workload: Any  # .measure(repeats=1, timeout_s=...) -> Measurement
    safety: Any  # tuner.search.safety_context.SafetyContext: begin(changes, label) -> transaction
    repeats: int = 3  # A/B pairs per trial
    max_repeats: int = 16  # pairs for a candidate that leads within the noise
    timeout_s: float = 10.0
    z: float = 2.0
    incumbent: dict[str, Any] = field(default_factory=dict)
    noise_samples: list[float] = field(default_factory=list)  # the incumbent's samples so far
    seen: set[str] = field(default_factory=set)
    objective: O.Objective = O.THROUGHPUT  # what the keep rule keeps (tuner.search.objective)
    floor_anchor: dict[str, float] = field(default_factory=dict)  # incumbent / start tokens/s

    def __post_init__(self) -> None:
        if not self.incumbent:  # in place: a mixed search shares this dict (even when empty)
            self.incumbent.update({n: k.read() for n, k in self.knobs.items()})

    # -- gates ---------------------------------------------------------------------------------
    def gates(self, also_known: Sequence[G.Gate] = (), no_change: Optional[G.Gate] = None) -> list[G.Gate]:
        """The host gates, cheapest first. An evaluator whose candidates carry more than knobs
        (the mixed one) adds its own "known" gates and its own idea of "changes nothing"."""
        return [
            G.known_knobs(self.knobs),
            *also_known,
            G.domain(self.knobs),
            G.not_in(self.safety.quarantined_keys, "quarantined", "quarantine"),
            G.not_in(lambda: self.seen, "duplicate", "duplicate"),
            no_change or self._no_change_gate,
            G.policy(self.safety.policy_check_for(self.knobs), lambda: dict(self.incumbent)),
            self.objective.budget_gate(lambda: dict(self.incumbent)),
        ]

    def _no_change_gate(self, c: Candidate) -> GateResult:
        if not self.changes(c):
            return GateResult(gate="duplicate", passed=False, code="duplicate",
                              detail="same values as the incumbent")
        return GateResult(gate="duplicate", passed=True)

    def changes(self, c: Candidate) -> dict[str, Any]:
        return {n: v for n, v in c.knobs.items() if not values_equal(v, self.incumbent.get(n))}

    # -- measurement ---------------------------------------------------------------------------
    def measure_incumbent(self, repeats: int = 6) -> Measurement:
        ms = [self.workload.measure(repeats=1, timeout_s=self.timeout_s) for _ in range(repeats)]
        m = keep.pool(ms)
        assert m is not None
        self.noise_samples = list(m.samples)
        return m

    @property
    def pooled_noise(self) -> float:
        return keep.rel_noise(self.noise_samples)

    def set_values(self, values: dict[str, Any]) -> None:
        """Write knob values (each knob reads back what it wrote)."""
        for n, v in values.items():
            self.knobs[n].apply(v)

    # -- one trial -----------------------------------------------------------------------------
    def begin(self, changes: dict[str, Any], trial: Trial, key: str) -> Any:
        """The safety transaction for a trial's host changes (applied, monitors armed), or None
        with the trial marked apply_failed when a write or its read-back fails."""
        try:
            txn = self.safety.begin(self.knobs, changes, label=f"{trial.run_id}#{trial.number}",
                                    candidate_key=key)
        except OperationFailed as e:
            trial.gates.append(GateResult(gate="apply", passed=False, code="apply_failed", detail=str(e)))
            trial.reason = "apply_failed"
            return None
        trial.gates.append(GateResult(gate="apply", passed=True))
        return txn

    def evaluate(self, cand: Candidate, trial: Trial) -> Trial:
        self.seen.add(cand.key())
        changes = self.changes(cand)
        before = {n: self.incumbent[n] for n in changes}
        txn = self.begin(changes, trial, cand.key())
        if txn is None:
            return trial
        ab = AB()  # `repeats` pairs; one that leads within the noise gets more (losers stop early)
        try:
            ab.run(self._measure_side(changes, before), self.repeats, max_pairs=self.max_repeats,
                   decided=self._decided, poll=txn.check)
            return self._decide(trial, txn, changes, ab.a, ab.b)
        except WorkloadHang as e:
            txn.rollback(f"hang: {e}")
            self.safety.quarantine(cand.key(), "hang")
            return self.rolled_back(trial, {"type": "hang", "reason": "instability_hang",
                                            "detail": str(e)}, ab.b)
        except WorkloadFailed as e:
            txn.rollback(f"measure failed: {e}")
            trial.reason = e.code or "measure_failed"
            trial.gates.append(GateResult(gate="measure", passed=False, code=trial.reason, detail=str(e)))
            return trial
        except self.safety.Instability as e:
            return self.rolled_back(trial, self.safety.incident_dict(e), ab.b)
        except self.safety.ProbationExpired as e:  # the watchdog got there first
            return self.rolled_back(trial, {"type": "deadline", "reason": "probation_expired",
                                            "detail": str(e)}, ab.b)

    def _measure_side(self, changes: dict[str, Any], before: dict[str, Any]) -> Callable[[str], Measurement]:
        def measure(side: str) -> Measurement:
            self.set_values(changes if side == "b" else before)
            return self.workload.measure(repeats=1, timeout_s=self.timeout_s)

        return measure

    def _decided(self, a: list[Measurement], b: list[Measurement]) -> bool:
        """Beyond the noise either way, or not ahead: more pairs would not change the verdict."""
        d = self.objective.decide(a, b, pooled_noise=self.pooled_noise, z=self.z)
        return d.reason != "within_noise" or d.stats["mean_log_ratio"] <= 0

    def _decide(self, trial: Trial, txn: Any, changes: dict[str, Any],
                a: list[Measurement], b: list[Measurement]) -> Trial:
        inc_m, cand_m = keep.pool(a), keep.pool(b)
        assert inc_m is not None and cand_m is not None
        self.noise_samples.extend(inc_m.samples)
        d = self.objective.decide(a, b, pooled_noise=self.pooled_noise, z=self.z,
                                  anchor=self.floor_anchor)
        trial.measurements = {"incumbent": inc_m.model_dump(), "candidate": cand_m.model_dump(),
                              "decision": {"threshold": d.threshold, **d.stats}}
        trial.objective = self.objective.score(b, d.reason, d.stats)
        trial.incumbent = self.objective.score(a, "baseline", {})
        trial.gain = d.gain
        obj = self.objective
        trial.gates.append(GateResult(gate="holistic", passed=d.verdict == "kept", code=d.reason,
                                      detail=f"{obj.name}: gain {d.gain:+.2%}, needed > {d.threshold:.2%}"
                                      + (f" ({obj.explain(d.reason, d.stats)})"
                                         if obj.own_reason(d.reason) else "")))
        if d.verdict == "kept":
            txn.confirm()  # polls the monitors once more: an incident now still rolls back
            self.incumbent.update(changes)
            self.objective.compound(self.floor_anchor, d.stats)
        else:
            txn.rollback(d.reason)
        trial.verdict, trial.reason = d.verdict, d.reason  # type: ignore[assignment]
        return trial

    def rolled_back(self, trial: Trial, incident: dict[str, Any], b: list[Measurement]) -> Trial:
        """Record an instability rollback on the trial (its candidate samples, if any, as the objective)."""
        trial.verdict = "rolled_back"
        trial.reason = incident.get("reason") or "instability_xid"
        trial.incident = incident
        trial.gates.append(GateResult(gate="probation", passed=False, code=trial.reason,
                                      detail=str(incident.get("detail", ""))))
        if b:
            trial.objective = (self.objective.score(b, trial.reason, {})
                               if self.objective.measured(b) and self.objective.needs
                               else statistics.median(s for m in b for s in m.samples or [m.value]))
        return trial
