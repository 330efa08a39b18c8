"""Optuna proposer (TPE by default, GP on request) over the same points as the others.

Each dimension is exposed as an integer index into its ordered values, so TPE sees the order of
clocks and watts. A candidate that was never measured (refused by policy, a duplicate) is told
as FAIL so it teaches nothing; an unstable one scores 0 so the sampler moves away from it.
"""
from __future__ import annotations

from typing import Any, Optional

from tuner.proposers.base import Point, Proposer, SearchSpace
from tuner.trial import Trial


class OptunaProposer(Proposer):
    name = "optuna"

    def __init__(self, space: SearchSpace, seed: int = 0, budget: Optional[int] = None,
                 sampler: str = "tpe", n_startup_trials: Optional[int] = None, **kw: Any):
        super().__init__(space, seed, budget)
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        if n_startup_trials is None:
            n_startup_trials = max(5, min(10, (budget or 50) // 6))
        if sampler == "gp":
            s = optuna.samplers.GPSampler(seed=seed, n_startup_trials=n_startup_trials)
        else:
            s = optuna.samplers.TPESampler(
                seed=seed, n_startup_trials=n_startup_trials, multivariate=True,
            )
        self.optuna = optuna
        self.study = optuna.create_study(direction="maximize", sampler=s)
        self.pending: dict[str, list[Any]] = {}  # point key -> asked optuna trials
        # space.start (the incumbent) is not enqueued: proposing the incumbent is a no-change
        # trial; its measured result reaches the sampler through tell() like any other

    def ask_point(self) -> Point:
        for attempt in range(21):
            if attempt == 20:  # the sampler keeps landing on invalid points: a random valid one
                import random

                p = self.random_point(random.Random(self.seed * 7919 + len(self.history)))
                self.study.enqueue_trial({d.name: d.index(p[d.name]) for d in self.space.dims})
            t = self.study.ask()
            p = {d.name: d.values[t.suggest_int(d.name, 0, len(d.values) - 1)] for d in self.space.dims}
            if self.space.is_valid(p) or attempt == 20:
                self.pending.setdefault(self.space.key(p), []).append(t)
                return p
            self.study.tell(t, state=self.optuna.trial.TrialState.FAIL)
        raise AssertionError("unreachable")

    def observe(self, point: Point, score: Optional[float], trial: Trial) -> None:
        waiting = self.pending.get(self.space.key(point))
        if not waiting:  # told about a point it did not ask (e.g. the baseline): add it
            dist = {d.name: self.optuna.distributions.IntDistribution(0, len(d.values) - 1)
                    for d in self.space.dims}
            if score is not None:
                self.study.add_trial(self.optuna.trial.create_trial(
                    params={d.name: d.index(point[d.name]) for d in self.space.dims},
                    distributions=dist, value=score))
            return
        t = waiting.pop(0)
        if score is None:
            self.study.tell(t, state=self.optuna.trial.TrialState.FAIL)
        else:
            self.study.tell(t, score)
