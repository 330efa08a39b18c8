"""Optuna proposer (TPE by default, GP on request) over the same points as the others.

Each dimension is exposed as an integer index into its ordered values, so TPE sees the order of
clocks and watts (and of power-of-two tile sizes: their index is their log2). A conditional
space (a kernel's variant and the parameters of that variant only) is exposed as one: the
variant as a categorical, then that variant's own parameters, with group-decomposed TPE.

The study is rebuilt from what was measured before every ask (a few dozen trials: cheap), which
lets the proposer
- never re-propose a point it has measured, and never return an invalid one: a draw that is
  either is told FAIL (it teaches nothing) and TPE draws again; when the draws keep landing
  there, the nearest valid unmeasured point to the last draw is taken;
- with `use_prior=True`, warm-start from a neighbouring problem's results (`warm_start`: the
  previous shape bucket of a kernel search): they enter the model as prior trials, put on this
  problem's scale by the configs measured in both, and each drops out once it is measured here.
  Off by default: on the replayed H200 grids it helped most families but cost matmul, whose
  neighbouring buckets are different regimes (4096^3 after decode shapes): 5.1% -> 10.5%.
A candidate that was never measured (refused by policy, failed) teaches nothing; an unstable
one scores 0 so the sampler moves away from it.
"""
from __future__ import annotations

import itertools
import random
import statistics
import warnings
from typing import Any, Optional

from tuner.proposers.base import Dim, Point, Proposer, SearchSpace
from tuner.trial import Trial

ENUMERATE_MAX = 200_000  # valid points are listed (for the nearest-valid fallback) up to this


class OptunaProposer(Proposer):
    name = "optuna"
    ATTEMPTS = 20  # sampler draws per ask before falling back to the nearest valid point

    def __init__(self, space: SearchSpace, seed: int = 0, budget: Optional[int] = None,
                 sampler: str = "tpe", n_startup_trials: Optional[int] = None,
                 use_prior: bool = False, **kw: Any):
        super().__init__(space, seed, budget)
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.optuna = optuna
        self.sampler = sampler
        if n_startup_trials is None:
            n_startup_trials = max(5, min(10, (budget or 50) // 6))
        self.n_startup = n_startup_trials
        self.use_prior = use_prior
        self.branches = space.branches
        self.tried: set[str] = set()  # every point told, measured or not: never proposed again
        self.scores: dict[str, tuple[Point, float]] = {}  # measured here
        self.prior: dict[str, tuple[Point, float]] = {}  # measured on a neighbouring problem
        self.asks = 0
        self._valid: Optional[list[Point]] = None

    # -- the space as Optuna sees it -------------------------------------------------------
    def _dists(self, p: Point) -> dict[str, Any]:
        """Optuna distributions of the params that apply at `p`."""
        D = self.optuna.distributions
        if self.branches is None:
            return {d.name: D.IntDistribution(0, len(d.values) - 1) for d in self.space.dims}
        switch, arms = self.branches
        out: dict[str, Any] = {switch: D.CategoricalDistribution(list(arms))}
        for d in arms[p[switch]]:
            out[f"{p[switch]}:{d.name}"] = D.IntDistribution(0, len(d.values) - 1)
        return out

    def _params(self, p: Point) -> dict[str, Any]:
        if self.branches is None:
            return {d.name: d.index(p[d.name]) for d in self.space.dims}
        switch, arms = self.branches
        out: dict[str, Any] = {switch: p[switch]}
        for d in arms[p[switch]]:
            out[f"{p[switch]}:{d.name}"] = d.index(p[d.name])
        return out

    def _suggest(self, t: Any) -> Point:
        if self.branches is None:
            return {d.name: d.values[t.suggest_int(d.name, 0, len(d.values) - 1)]
                    for d in self.space.dims}
        switch, arms = self.branches
        arm = t.suggest_categorical(switch, list(arms))
        p: Point = {d.name: d.values[0] for d in self.space.dims}  # don't-care: first value
        p[switch] = arm
        for d in arms[arm]:
            p[d.name] = d.values[t.suggest_int(f"{arm}:{d.name}", 0, len(d.values) - 1)]
        return p

    def _study(self) -> Any:
        optuna = self.optuna
        seed = (self.seed * 1_000_003 + self.asks) % (2 ** 31)
        if self.sampler == "gp":
            s = optuna.samplers.GPSampler(seed=seed, n_startup_trials=self.n_startup)
        else:
            with warnings.catch_warnings():  # group=True is marked experimental
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                s = optuna.samplers.TPESampler(seed=seed, n_startup_trials=self.n_startup,
                                               multivariate=True,
                                               group=self.branches is not None)
        study = optuna.create_study(direction="maximize", sampler=s)
        trials = []
        for p, v in self._prior_scaled() + list(self.scores.values()):
            trials.append(optuna.trial.create_trial(params=self._params(p),
                                                    distributions=self._dists(p), value=v))
        study.add_trials(trials)
        return study

    def _prior_scaled(self) -> list[tuple[Point, float]]:
        """Prior trials not measured here, on this problem's scale: the median ratio of the
        scores of the points measured in both (none yet: no prior)."""
        if not self.prior or not self.use_prior:
            return []
        ratios = [self.scores[k][1] / self.prior[k][1] for k in self.prior
                  if k in self.scores and self.scores[k][1] > 0 and self.prior[k][1] > 0]
        if not ratios:
            return []
        r = statistics.median(ratios)
        return [(p, v * r) for k, (p, v) in self.prior.items() if k not in self.tried]

    # -- ask / tell ---------------------------------------------------------------------
    def ask_point(self) -> Point:
        self.asks += 1
        study = self._study()
        p: Point = {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for _ in range(self.ATTEMPTS):
                t = study.ask()
                p = self._suggest(t)
                study.tell(t, state=self.optuna.trial.TrialState.FAIL)  # a draw, not a result
                if self.space.is_valid(p) and self.space.key(p) not in self.tried:
                    return p
        q = self._nearest(p)
        if q is not None:
            return q
        return self.random_point(random.Random(self.seed * 7919 + self.asks), avoid=self.tried)

    def observe(self, point: Point, score: Optional[float], trial: Trial) -> None:
        k = self.space.key(point)
        self.tried.add(k)
        if score is not None:
            self.scores[k] = (dict(point), score)

    def warm_start(self, observations: list[tuple[Point, float]]) -> None:
        for p, v in observations:
            if v is not None and self.space.is_valid(p):
                self.prior[self.space.key(p)] = (dict(p), v)

    # -- fallback -----------------------------------------------------------------------
    def _valid_points(self) -> list[Point]:
        if self._valid is None:
            self._valid = []
            if self.branches is not None:
                switch, arms = self.branches
                base = {d.name: d.values[0] for d in self.space.dims}
                combos = ((dict(base, **{switch: a}, **dict(zip([d.name for d in ds], c))))
                          for a, ds in arms.items()
                          for c in itertools.product(*(d.values for d in ds)))
            elif self.space.size() <= ENUMERATE_MAX:
                combos = (dict(zip(self.space.names, c))
                          for c in itertools.product(*(d.values for d in self.space.dims)))
            else:
                combos = iter(())
            for i, p in enumerate(combos):
                if i >= ENUMERATE_MAX:
                    break
                if self.space.is_valid(p):
                    self._valid.append(p)
        return self._valid

    def _nearest(self, p: Point) -> Optional[Point]:
        """The valid unmeasured point closest to `p` (normalised index distance; another
        branch counts as far), ties broken at random."""
        cands = [q for q in self._valid_points() if self.space.key(q) not in self.tried]
        if not cands or not p:
            return None
        rng = random.Random(self.seed * 104729 + self.asks)

        def dist(q: Point) -> float:
            dims = self.space.dims
            if self.branches is not None:
                switch, arms = self.branches
                if q[switch] != p[switch]:
                    return 1e9
                dims = arms[q[switch]]
            return sum(abs(_idx(d, q[d.name]) - _idx(d, p[d.name])) / max(1, len(d.values) - 1)
                       for d in dims)

        # validity can change during a run (a host knob at its policy rate limit): the points
        # listed at the start are checked again, nearest first
        ds = {self.space.key(q): dist(q) for q in cands}
        best = next((ds[self.space.key(q)] for q in sorted(cands, key=lambda q: ds[self.space.key(q)])
                     if self.space.is_valid(q)), None)
        if best is None:
            return None
        return rng.choice([q for q in cands if ds[self.space.key(q)] == best and self.space.is_valid(q)])


def _idx(d: Dim, v: Any) -> int:
    try:
        return d.index(v)
    except ValueError:
        return 0
