"""Cheap gates a candidate passes before anything is written. Each returns a GateResult; the
first failure rejects the trial with that gate's stable reason code."""
from __future__ import annotations

import time
from typing import Any, Callable, Iterable, Optional

from tuner.errors import OutOfDomain
from tuner.trial import Candidate, GateResult

Gate = Callable[[Candidate], GateResult]


def known_knobs(knobs: dict[str, Any]) -> Gate:
    def gate(c: Candidate) -> GateResult:
        unknown = sorted(set(c.knobs) - set(knobs))
        if unknown:
            return GateResult(gate="known", passed=False, code="unknown_knob",
                              detail=f"unknown knob(s): {', '.join(unknown)}")
        return GateResult(gate="known", passed=True)

    return gate


def domain(knobs: dict[str, Any]) -> Gate:
    """Values must lie in the domain the device itself reports."""

    def gate(c: Candidate) -> GateResult:
        for name, value in c.knobs.items():
            try:
                c.knobs[name] = knobs[name].validate(value)  # normalised (e.g. 1500 → [1500, 1500])
            except OutOfDomain as e:
                return GateResult(gate="domain", passed=False, code="out_of_domain", detail=str(e))
        return GateResult(gate="domain", passed=True)

    return gate


def policy(check: Callable[[str, Any, Any], Optional[str]], current: Callable[[], dict[str, Any]]) -> Gate:
    """`check(knob, old, new)` returns None when allowed, else the refusal naming the rule. A
    knob the candidate leaves at its current value is not a change (the transaction writes,
    journals and rate-limits nothing for it), so the policy is not asked about it."""
    from tuner.knobs.base import values_equal

    def gate(c: Candidate) -> GateResult:
        cur = current()
        for name, value in c.knobs.items():
            if name in cur and values_equal(value, cur[name]):
                continue
            why = check(name, cur.get(name), value)
            if why:
                return GateResult(gate="policy", passed=False, code="policy_denied", detail=why)
        return GateResult(gate="policy", passed=True)

    return gate


def not_in(keys: Callable[[], Iterable[str]], code: str, gate_name: str) -> Gate:
    """Reject candidates whose key is in a set (quarantine, already evaluated)."""

    def gate(c: Candidate) -> GateResult:
        if c.key() in set(keys()):
            return GateResult(gate=gate_name, passed=False, code=code,
                              detail=f"candidate is {code}")
        return GateResult(gate=gate_name, passed=True)

    return gate


def run_gates(gates: list[Gate], c: Candidate) -> tuple[list[GateResult], Optional[GateResult]]:
    """Run gates in order; stop at the first failure (cheap gates first)."""
    results = []
    for g in gates:
        t0 = time.perf_counter()
        r = g(c)
        r.seconds = time.perf_counter() - t0
        results.append(r)
        if not r.passed:
            return results, r
    return results, None
