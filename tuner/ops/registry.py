"""The operation table: `@operation("name")` registers a function under its name; `options=` a
pydantic model that checks its arguments (tuner.ops.args), where the signature cannot say them."""
from __future__ import annotations

from typing import Any, Callable, Optional

OpFunc = Callable[..., dict[str, Any]]
OPS: dict[str, OpFunc] = {}


def operation(name: str, options: Optional[type] = None) -> Callable[[OpFunc], OpFunc]:
    def deco(fn: OpFunc) -> OpFunc:
        if options is not None:
            fn.options = options  # type: ignore[attr-defined]
        OPS[name] = fn
        return fn

    return deco
