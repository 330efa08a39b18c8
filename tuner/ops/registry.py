"""The operation table: `@operation("name")` registers a function under its name."""
from __future__ import annotations

from typing import Any, Callable

OpFunc = Callable[..., dict[str, Any]]
OPS: dict[str, OpFunc] = {}


def operation(name: str) -> Callable[[OpFunc], OpFunc]:
    def deco(fn: OpFunc) -> OpFunc:
        OPS[name] = fn
        return fn

    return deco
