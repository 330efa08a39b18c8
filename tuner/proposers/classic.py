"""Random, grid and coordinate-sweep proposers."""
from __future__ import annotations

import itertools
import random
from typing import Any, Optional

from tuner.proposers.base import Point, Proposer, SearchSpace
from tuner.trial import Trial


class RandomProposer(Proposer):
    name = "random"

    def __init__(self, space: SearchSpace, seed: int = 0, budget: Optional[int] = None, **kw: Any):
        super().__init__(space, seed, budget)
        self.rng = random.Random(seed)
        self.seen: set[str] = set()

    def ask_point(self) -> Point:
        p = self.random_point(self.rng, avoid=self.seen)
        self.seen.add(self.space.key(p))
        return p
    def observe(self, point: Point, score: Optional[float], trial: Trial) -> None:
        self.seen.add(self.space.key(point))  # told, whoever asked it (tuner.proposers.seeded)


def grid_levels(sizes: list[int], budget: Optional[int]) -> list[int]:
    """How many evenly spaced values to take per dimension so the grid fits the budget: raise the
    dimension with the fewest levels (ties: the larger dimension) while the product stays within
    the budget, so every dimension gets about budget^(1/d) levels unless it is smaller."""
    if budget is None:
        return list(sizes)
    levels = [1] * len(sizes)
    while True:
        grown = False
        for i in sorted(range(len(sizes)), key=lambda i: (levels[i], -sizes[i])):
            if levels[i] < sizes[i]:
                trial = levels.copy()
                trial[i] += 1
                prod = 1
                for x in trial:
                    prod *= x
                if prod <= budget:
                    levels, grown = trial, True
                    break
        if not grown:
            return levels


def spread(values: list[Any], n: int) -> list[Any]:
    if n >= len(values):
        return list(values)
    if n == 1:
        return [values[len(values) // 2]]
    return [values[round(i * (len(values) - 1) / (n - 1))] for i in range(n)]


class GridProposer(Proposer):
    """Exhaustive over the space, or an evenly spaced sub-grid that fits `budget`."""

    name = "grid"

    def __init__(self, space: SearchSpace, seed: int = 0, budget: Optional[int] = None, **kw: Any):
        super().__init__(space, seed, budget)
        levels = grid_levels([len(d.values) for d in space.dims], budget)
        axes = [spread(d.values, n) for d, n in zip(space.dims, levels)]
        self.points = [p for p in self._product(axes) if space.is_valid(p)]
        if budget and len(self.points) < budget // 2 and space.valid is not None \
                and space.size() <= self.MAX_ENUMERATE:
            # constrained spaces (kernel configs): evenly spaced axes mostly land on invalid
            # combinations, so stride evenly through the valid points of the full grid instead
            valid = [p for p in self._product([d.values for d in space.dims]) if space.is_valid(p)]
            self.points = spread(valid, budget)
        self.i = 0
        self.rng = random.Random(f"grid:{seed}")  # not the random proposer's sequence

    MAX_ENUMERATE = 500_000

    def _product(self, axes: list[list[Any]]) -> Any:
        names = [d.name for d in self.space.dims]
        return ({n: v for n, v in zip(names, combo)} for combo in itertools.product(*axes))

    def ask_point(self) -> Point:
        if self.i < len(self.points):
            p = self.points[self.i]
            self.i += 1
            return p
        # grid exhausted inside the budget: keep sampling at random
        return self.random_point(self.rng, avoid={self.space.key(p) for p in self.points})


class CoordinateProposer(Proposer):
    """Coordinate sweep: from the incumbent, sweep one dimension at a time over a coarse set of
    values, move to the best, go to the next dimension; after a full pass, refine with a finer
    set around the best. Deterministic; good for spaces where knobs act mostly independently."""

    name = "coordinate"

    def __init__(self, space: SearchSpace, seed: int = 0, budget: Optional[int] = None,
                 points_per_sweep: int = 7, **kw: Any):
        super().__init__(space, seed, budget)
        self.k = points_per_sweep
        start = space.start or {}
        self.best: Point = {}
        for d in space.dims:  # from the incumbent where given (snapped onto the grid), else the middle
            v = start.get(d.name)
            self.best[d.name] = d.values[d.index(v)] if v is not None else d.values[len(d.values) // 2]
        self.best_score: Optional[float] = None
        self.radius = {d.name: len(d.values) for d in space.dims}
        self.queue: list[Point] = []
        self.dim_i = -1
        self.seen: set[str] = set()
        if start and set(start) >= set(space.names):
            self.seen.add(space.key(self.best))  # the incumbent: measured as the baseline
        self.rng = random.Random(seed)

    def _sweep(self) -> list[Point]:
        out = []
        for _ in range(len(self.space.dims) * 2):
            self.dim_i = (self.dim_i + 1) % len(self.space.dims)
            if self.dim_i == 0 and out == [] and self.best_score is not None:
                for n in self.radius:  # a full pass done: refine around the best
                    self.radius[n] = max(1, self.radius[n] // 3)
            d = self.space.dims[self.dim_i]
            c = d.index(self.best[d.name])
            r = self.radius[d.name]
            window = d.values[max(0, c - r): c + r + 1]
            for v in spread(window, self.k):
                p = dict(self.best, **{d.name: v})
                if self.space.key(p) not in self.seen and self.space.is_valid(p):
                    out.append(p)
            if out:
                return out
        return []

    def ask_point(self) -> Point:
        if not self.queue:
            self.queue = self._sweep()
        if not self.queue:  # converged: nothing left to sweep, sample at random
            p = self.random_point(self.rng, avoid=self.seen)
        else:
            p = self.queue.pop(0)
        self.seen.add(self.space.key(p))
        return p

    def observe(self, point: Point, score: Optional[float], trial: Trial) -> None:
        self.seen.add(self.space.key(point))  # told, whoever asked it (tuner.proposers.seeded)
        # Move to a point the loop kept (better than the incumbent beyond noise). Where the caller
        # gives no keep verdicts at all (e.g. a plain objective search), move to the best score.
        if trial.verdict == "kept":
            self.kept_seen = True
            self.best, self.best_score = dict(point), score
        elif trial.incumbent is not None:
            pass  # judged against an incumbent and not kept: the sweep stays on the incumbent
            # (moving to a reverted point would carry its change into every later candidate)
        elif (not getattr(self, "kept_seen", False) and score is not None
              and trial.verdict != "rolled_back"
              and (self.best_score is None or score > self.best_score)):
            self.best, self.best_score = dict(point), score
