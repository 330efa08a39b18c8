"""Search spaces and the ask/tell proposer interface.

A SearchSpace is an ordered list of dimensions, each an ordered list of search values, plus the
two mappings between a point (one value per dimension) and a Candidate. Host search builds one
from the knobs' own domains; kernel search from a family's parameter space. Proposers only ever
see points, so the same samplers serve both (as Optuna separates samplers from storage).
"""
from __future__ import annotations

import json
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from tuner.knobs.base import values_equal
from tuner.trial import Candidate, Trial

Point = dict[str, Any]


@dataclass
class Dim:
    name: str
    values: list[Any]

    def index(self, v: Any) -> int:
        try:
            return self.values.index(v)
        except ValueError:  # nearest for numbers (a profile value off the search grid)
            if isinstance(v, (int, float)) and all(isinstance(x, (int, float)) for x in self.values):
                return min(range(len(self.values)), key=lambda i: abs(self.values[i] - v))
            raise


@dataclass
class SearchSpace:
    dims: list[Dim]
    to_candidate: Callable[[Point], Candidate] = field(default=lambda p: Candidate(knobs=dict(p)))
    from_candidate: Callable[[Candidate], Optional[Point]] = field(
        default=lambda c: dict(c.knobs) if c.knobs else None
    )
    #: validity constraint on a point (e.g. a kernel config's shared-memory need); None: all valid
    valid: Optional[Callable[[Point], bool]] = None
    #: where coordinate search starts (the incumbent); defaults to each dimension's middle
    start: Optional[Point] = None
    #: conditional structure, for samplers that model it: (switch dim, {switch value: the dims
    #: that apply under it, each with the values it takes there}). A dim a branch does not list
    #: is "don't care" under it and keeps its first value (a kernel's variant and its own
    #: parameters: one point per config, not one per combination of unused parameters)
    branches: Optional[tuple[str, dict[Any, list[Dim]]]] = None

    @property
    def names(self) -> list[str]:
        return [d.name for d in self.dims]

    def size(self) -> int:
        return math.prod(len(d.values) for d in self.dims)

    def is_valid(self, p: Point) -> bool:
        return self.valid is None or bool(self.valid(p))

    def key(self, p: Point) -> str:
        return json.dumps([p.get(n) for n in self.names], default=str)

    @classmethod
    def for_knobs(cls, knobs: dict[str, Any], start: Optional[Point] = None,
                  allowed: Optional[Callable[[str, Any, Any], bool]] = None,
                  current: Optional[Callable[[], dict[str, Any]]] = None,
                  allowed_now: Optional[Callable[[str, Any, Any], bool]] = None) -> "SearchSpace":
        """One dimension per knob over the domain the device reports (knobs with an empty
        search domain, e.g. unsupported offsets, are left out). `allowed(knob, before, value)`
        (the policy): each dimension keeps only the values allowed from the start (ranges,
        floors, steps), and a point is valid only if every value is allowed from `current()`
        (the incumbent, as kept changes move it) by `allowed_now` (default `allowed`; the policy
        with its journal: a knob at its rate limit stays put), so proposers never draw a refused
        change."""
        doms = {n: k.limits() for n, k in knobs.items()}
        begin = start or {}

        def keep(n: str, v: Any) -> bool:
            val = doms[n].from_search(v)
            return allowed is None or values_equal(val, begin.get(n)) or allowed(n, begin.get(n), val)

        dims = [Dim(n, vals) for n, d in doms.items()
                if (vals := [v for v in d.search_values() if keep(n, v)])]

        def to_candidate(p: Point) -> Candidate:
            return Candidate(knobs={n: doms[n].from_search(v) for n, v in p.items()})

        def from_candidate(c: Candidate) -> Optional[Point]:
            out: Point = {}
            for d in dims:
                v = doms[d.name].to_search(c.knobs.get(d.name))
                if v is None:
                    return None
                try:
                    out[d.name] = d.values[d.index(v)]
                except ValueError:
                    return None
            return out

        # the incumbent's knob values as a point; a value with no search equivalent (unlocked
        # clocks) leaves its dimension to the proposer's own default
        point = None if start is None else {
            d.name: doms[d.name].to_search(start.get(d.name)) for d in dims
            if doms[d.name].to_search(start.get(d.name)) is not None}
        valid = None
        now = allowed_now or allowed
        if now is not None and current is not None:
            def valid(p: Point) -> bool:
                cur = current()
                for n, v in p.items():
                    val = doms[n].from_search(v)
                    if not values_equal(val, cur.get(n)) and not now(n, cur.get(n), val):
                        return False
                return True
        return cls(dims, to_candidate, from_candidate, start=point, valid=valid)


class Proposer(ABC):
    """ask() -> Candidate; tell(trial). Subclasses implement `ask_point` and may use `observe`."""

    name = "base"

    def __init__(self, space: SearchSpace, seed: int = 0, budget: Optional[int] = None, **_: Any):
        self.space = space
        self.seed = seed
        self.budget = budget
        self.history: list[tuple[Point, Optional[float], Trial]] = []

    def random_point(self, rng: Any, avoid: Optional[set[str]] = None) -> Point:
        """A uniformly drawn valid point, not in `avoid` while the space allows it."""
        p: Point = {}
        for _ in range(1000):
            p = {d.name: rng.choice(d.values) for d in self.space.dims}
            if self.space.is_valid(p) and (avoid is None or self.space.key(p) not in avoid):
                return p
        return p

    def ask(self) -> Candidate:
        c = self.space.to_candidate(self.ask_point())
        c.proposer = self.name
        return c

    @abstractmethod
    def ask_point(self) -> Point: ...

    def tell(self, trial: Trial) -> None:
        p = self.space.from_candidate(trial.candidate)
        if p is None:
            return
        score = score_of(trial)
        self.history.append((p, score, trial))
        self.observe(p, score, trial)

    def warm_start(self, observations: list[tuple[Point, float]]) -> None:
        """Scores measured on a neighbouring problem (the previous shape bucket of a kernel
        search), as a prior. Proposers that model the objective use them; the others ignore
        them (what a proposer measures itself is always told through `tell`)."""

    def trial_cost(self, trial: Trial) -> dict[str, float]:
        """What proposing this trial cost (tokens, dollars); free for the classical proposers."""
        return {}

    def observe(self, point: Point, score: Optional[float], trial: Trial) -> None:
        """Hook for proposers that learn (score None: never measured, e.g. policy refusal)."""


def score_of(trial: Trial) -> Optional[float]:
    """What a proposer should learn from a trial: the measured objective; 0 for a candidate that
    made the host unstable (so samplers move away from it); None when nothing was measured."""
    if trial.verdict == "rolled_back":
        return 0.0
    return trial.objective


class ProposalRejected(Exception):
    """Raised by `ask()` when the proposer's own answer is unusable (an LLM reply that is
    malformed, names no tool, fails its schema): the loop records a rejected trial with `code`
    (a tuner.trial.REASONS key) instead of crashing. `candidate` is what could be salvaged (an
    empty Candidate when nothing could)."""

    def __init__(self, code: str, detail: str, candidate: Optional[Candidate] = None):
        super().__init__(f"{code}: {detail}")
        self.code, self.detail = code, detail
        self.candidate = candidate if candidate is not None else Candidate()
