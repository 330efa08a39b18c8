"""The search loop: propose, gate, evaluate, store, tell, repeat.

Everything with weight lives in the pieces it calls: the proposer (tuner.proposers), the gates
(tuner.search.gates), the evaluator that applies a candidate inside a safety transaction and measures it
against the incumbent (tuner.search.host.evaluator), and the trial store (tuner.search.store).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Protocol

from tuner.errors import WorkloadBroken
from tuner.proposers.base import ProposalRejected, Proposer
from tuner.search.gates import Gate, run_gates
from tuner.search.store import TrialStore
from tuner.trial import Candidate, GateResult, Trial


class Evaluator(Protocol):
    def gates(self) -> list[Gate]: ...
    def evaluate(self, candidate: Candidate, trial: Trial) -> Trial: ...


@dataclass
class LoopResult:
    run_id: str
    trials: list[Trial] = field(default_factory=list)


def run(
    proposer: Proposer,
    evaluator: Evaluator,
    store: Optional[TrialStore],
    run_id: str,
    budget: int,
    on_trial: Optional[Callable[[Trial], None]] = None,
    done: Optional[Callable[[], bool]] = None,  # an evaluator's own budget (e.g. distinct configs)
) -> LoopResult:
    result = LoopResult(run_id)
    while len(result.trials) < budget and not (done and done()):
        t0 = time.time()
        try:
            candidate, unusable = proposer.ask(), None
        except ProposalRejected as e:  # the proposer's answer itself was unusable (issue 6)
            candidate, unusable = e.candidate, e
        trial = Trial(run_id=run_id, number=len(result.trials) + 1, candidate=candidate,
                      verdict="rejected", reason="malformed", started_at=t0,
                      ideas=list(getattr(proposer, "ideas", None) or []))
        if unusable is not None:
            trial.gates = [GateResult(gate="proposal", passed=False, code=unusable.code,
                                      detail=unusable.detail)]
            trial.reason = unusable.code
        else:
            trial.gates, failed = run_gates(evaluator.gates(), candidate)
            if failed is not None:
                trial.reason = failed.code or "rejected"
            else:
                try:
                    trial = evaluator.evaluate(candidate, trial)
                except WorkloadBroken as e:  # the search stops; the trial that did it is kept
                    trial.verdict, trial.reason = "rejected", "workload_broken"
                    trial.gates.append(GateResult(gate="measure", passed=False,
                                                  code="workload_broken", detail=str(e)[:500]))
                    trial.duration_s = time.time() - t0
                    if store is not None:
                        store.add(trial)
                    result.trials.append(trial)
                    raise
        trial.duration_s = time.time() - t0
        trial.cost = proposer.trial_cost(trial)  # the LLM proposer's tokens and $; else {}
        if store is not None:  # a replay keeps no store
            store.add(trial)
        proposer.tell(trial)
        result.trials.append(trial)
        if on_trial:
            on_trial(trial)
    return result
