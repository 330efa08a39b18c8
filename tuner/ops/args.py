"""The arguments of an operation, checked against its signature by one pydantic model per
operation: the CLI's local path (`tuner.cli.common.invoke`) and the daemon's control socket validate with the
same model, so `limit: "x"` is the same bad input (exit 2) however it arrives."""
from __future__ import annotations

import functools
import inspect
import typing
from typing import Annotated, Any, Callable

from pydantic import Field

from tuner.errors import BadInput

#: how many records a read returns (0: none); bounded so a count never overflows SQLite's int
Count = Annotated[int, Field(ge=0, le=1_000_000)]
#: a wait, in seconds
Seconds = Annotated[float, Field(gt=0, le=86400)]


@functools.lru_cache(maxsize=None)
def model_for(fn: Callable[..., Any]) -> Any:
    """A pydantic model of fn's keyword arguments (its first parameter, the settings, left out).
    Unknown arguments are refused unless fn takes **kwargs; floats must be finite. An operation
    registered with `options=` (the searches) is checked by that model instead."""
    from pydantic import ConfigDict, create_model

    declared = getattr(fn, "options", None)
    if declared is not None:
        return declared

    sig = inspect.signature(fn)
    try:
        hints = typing.get_type_hints(fn, include_extras=True)  # Field bounds in Annotated
    except Exception:  # an annotation that does not resolve: check presence only
        hints = {}
    params = list(sig.parameters.values())[1:]
    extra = "allow" if any(p.kind is p.VAR_KEYWORD for p in params) else "forbid"
    fields: dict[str, Any] = {}
    for p in params:
        if p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
            continue
        ann = hints.get(p.name, Any)
        fields[p.name] = (ann, ... if p.default is p.empty else p.default)
    return create_model(f"{fn.__name__}_args", __config__=ConfigDict(
        extra=extra, allow_inf_nan=False, arbitrary_types_allowed=True,
        hide_input_in_errors=True), **fields)


def validate(op: str, fn: Callable[..., Any], args: dict[str, Any]) -> dict[str, Any]:
    """args as fn should get them, or BadInput naming the operation, the field and what was
    expected (values are not echoed: an argument may hold a secret)."""
    from pydantic import ValidationError

    from tuner.validation import first_error

    model = model_for(fn)
    if not isinstance(args, dict):
        raise BadInput(f"{op}: arguments: expected an object of named arguments")
    try:
        m = model.model_validate(args)
    except ValidationError as e:
        names = getattr(model, "FLAGS", None)
        raise BadInput(f"{op}: " + first_error(e, unknown="unknown argument", top="", names=names,
                                               label="argument")) from None
    out = {k: getattr(m, k) for k in model.model_fields if k in args}
    out.update({k: v for k, v in args.items() if k not in model.model_fields})  # **kwargs
    return out


def call(op: str, fn: Callable[..., Any], settings: Any, args: dict[str, Any]) -> Any:
    """fn run with args checked by its model; an operation with an options model gets the model
    as built here, once (tuner.ops.registry: `.run`), not a dict it would build again."""
    model = getattr(fn, "options", None)
    if model is None:
        return fn(settings, **validate(op, fn, args))
    if not isinstance(args, dict):
        raise BadInput(f"{op}: arguments: expected an object of named arguments")
    return fn.run(settings, model.parse(op, args))
