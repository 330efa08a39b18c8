"""Shared pieces of the search tests."""
from __future__ import annotations

from tuner.proposers.base import Proposer


class Scripted(Proposer):
    """A proposer that asks the given candidates in order (what a test wants judged)."""

    name = "scripted"

    def __init__(self, space, cands):
        super().__init__(space)
        self.cands = list(cands)

    def ask(self):
        return self.cands.pop(0)

    def ask_point(self):  # pragma: no cover
        raise NotImplementedError


def record_model_stats(wl) -> list:
    """The model process's stats with each measurement `wl` (a SimHostLlamaWorkload over a model
    process) makes from now on: which process measured, and the stored sources loaded there."""
    ran, real = [], wl.llama.measure

    def measure(repeats=5, timeout_s=None):
        m = real(repeats, timeout_s)
        ran.append(m.extra["model_process"])
        return m

    wl.llama.measure = measure
    return ran
