"""Enqueued points first, then the proposer's own: Optuna's `enqueue_trial` for every proposer.

A search that has a good guess (the dispatch table shipped for this GPU, a profile measured on a
sibling host) should measure it before sampling: the guess is judged and A/B-measured like any
other candidate, so a guess that loses end to end is reverted, and what the inner proposer
learns from it (`tell`) is the same as if it had asked it."""
from __future__ import annotations

from typing import Any, Optional

from tuner.proposers.base import Point, Proposer
from tuner.trial import Candidate, Trial


class Seeded(Proposer):
    """Asks `points` in order (skipping invalid ones), each with `rationale`, then `inner`'s."""

    def __init__(self, inner: Proposer, points: list[Point], rationale: str = "enqueued"):
        super().__init__(inner.space, inner.seed, inner.budget)
        self.inner = inner
        self.name = inner.name
        self.queue = [dict(p) for p in points if inner.space.is_valid(p)]
        self.rationale = rationale
        self._mine: set[int] = set()  # ids of the candidates asked from the queue

    @property
    def ideas(self) -> Any:  # the LLM proposer's notes, when it is the inner one
        return getattr(self.inner, "ideas", None)

    def ask(self) -> Candidate:
        if not self.queue:
            return self.inner.ask()
        c = self.space.to_candidate(self.queue.pop(0))
        c.proposer, c.rationale = self.name, self.rationale
        self._mine.add(id(c))
        return c

    def ask_point(self) -> Point:  # ask() above never reaches it with a queue left
        return self.inner.ask_point()

    def tell(self, trial: Trial) -> None:
        self.inner.tell(trial)
        self.history = self.inner.history

    def trial_cost(self, trial: Trial) -> dict[str, float]:
        return {} if id(trial.candidate) in self._mine else self.inner.trial_cost(trial)

    def warm_start(self, observations: list[tuple[Point, float]]) -> None:
        self.inner.warm_start(observations)


def seeded(inner: Proposer, points: Optional[list[Point]], rationale: str = "enqueued") -> Proposer:
    """`inner` itself when there is nothing to enqueue."""
    return Seeded(inner, points, rationale) if points else inner
