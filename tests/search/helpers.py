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
