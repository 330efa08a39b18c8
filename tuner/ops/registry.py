"""The operation table: `@operation("name")` registers a function under its name; `options=` a
pydantic model that checks its arguments (tuner.ops.args), where the signature cannot say them;
`reads=True` an operation that changes nothing (served without the writer lock)."""
from __future__ import annotations

import functools
from typing import Any, Callable, Optional

OpFunc = Callable[..., dict[str, Any]]
OPS: dict[str, OpFunc] = {}
#: the operations that only read: the daemon runs them concurrently, without the writer lock
READS: set[str] = set()


def operation(name: str, options: Optional[type] = None,
              reads: bool = False) -> Callable[[OpFunc], OpFunc]:
    """With `options=`, fn takes (settings, the options model): the registered operation takes
    keyword arguments (the socket's JSON, the daemon's child) and builds the model from them;
    `.run(settings, model)` takes a model already built (the CLI's local path: built once)."""
    def deco(fn: OpFunc) -> OpFunc:
        op = fn
        if options is not None:
            @functools.wraps(fn)
            def op(settings: Any, **kw: Any) -> dict[str, Any]:
                return fn(settings, options.parse(name, kw))  # type: ignore[attr-defined]

            op.options = options  # type: ignore[attr-defined]
            op.run = fn  # type: ignore[attr-defined]
        OPS[name] = op
        if reads:
            READS.add(name)
        return op

    return deco
