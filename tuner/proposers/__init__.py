"""Proposers (ask/tell) by name. Heavy ones (optuna, the LLM) are imported only when made."""
from __future__ import annotations

import importlib
from typing import Any, Optional

from tuner.errors import BadInput
from tuner.proposers.base import Dim, Point, Proposer, SearchSpace, score_of

_REGISTRY: dict[str, str] = {
    "random": "tuner.proposers.classic:RandomProposer",
    "grid": "tuner.proposers.classic:GridProposer",
    "coordinate": "tuner.proposers.classic:CoordinateProposer",
    "optuna": "tuner.proposers.optuna_tpe:OptunaProposer",
    "tpe": "tuner.proposers.optuna_tpe:OptunaProposer",
    "llm": "tuner.proposers.llm.proposer:LLMProposer",
}


def names() -> list[str]:
    return sorted(_REGISTRY)


def make(name: str, space: SearchSpace, seed: int = 0, budget: Optional[int] = None,
         **kw: Any) -> Proposer:
    if name not in _REGISTRY:
        raise BadInput(f"--proposer: unknown proposer {name!r}; expected one of {', '.join(names())}")
    mod, cls = _REGISTRY[name].split(":")
    return getattr(importlib.import_module(mod), cls)(space, seed=seed, budget=budget, **kw)


__all__ = ["Dim", "Point", "Proposer", "SearchSpace", "make", "names", "score_of"]
