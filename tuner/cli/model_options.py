"""Search commands built from their options models (tuner.search.options): every field with a
flag is an option whose flag, metavar, help and default are the field's, so a field added to a
model is on the command line with no edit here. typer reads the command function's
`__signature__`, which is built from `model_fields`.

What the command line takes in another form than the model (a `4096x8192` shape, a file to
read as the invoking user) is turned into the field's value by the parser the field names
(PARSERS). Floats are checked finite and inside the field's bounds as they are parsed; the rest
is checked by the model itself, once: the options are built here and passed to the operation as
built (tuner.cli.common.invoke), or sent to the daemon as JSON."""
from __future__ import annotations

import inspect
import json
import typing
from pathlib import Path
from typing import Any, Callable, Optional

import annotated_types
import typer

from tuner.cli.common import invoke, settings
from tuner.cli.numbers import finite
from tuner.errors import BadInput


def _shape(text: str, flag: str, values: dict[str, Any]) -> list[int]:
    from tuner.search.options import _family, shape_of

    try:
        family = _family(values["family"])
    except ValueError as e:
        raise BadInput(f"--family: {e}") from None
    try:
        return shape_of(text, family)
    except ValueError as e:
        raise BadInput(f"{flag} {e}") from None


def _file(path: str, flag: str, values: dict[str, Any]) -> str:
    if not Path(path).is_file():
        raise BadInput(f"{flag} {path}: no such file")
    return path


def _diagnosis(path: str, flag: str, values: dict[str, Any]) -> dict[str, Any]:
    from safety.inputs import load_json

    d = load_json(Path(path), f"{flag} {path}", error=BadInput)
    missing = [k for k in ("device", "workload", "findings", "ops")
               if not isinstance(d, dict) or k not in d]
    if missing:
        raise BadInput(f"{flag} {path}: expected the JSON of `metaltune diagnose --json` "
                       f"(missing {', '.join(missing)})")
    return d


def _candidate(path: str, flag: str, values: dict[str, Any]) -> str:
    """A candidate module's text, read here as the invoking user (the daemon gets the text)."""
    import os

    from safety.inputs import read_text

    if not os.path.lexists(path):
        raise BadInput(f"{flag} {path}: no such file")
    if Path(path).suffix != ".py":
        raise BadInput(f"{flag} {path}: expected a Python module (.py)")
    # a regular file of UTF-8 text (PEP 3120: Python source is UTF-8), bounded, refused in one
    # line before anything starts: not a FIFO to wait on, not bytes the judge's child chokes on
    return read_text(path, f"{flag} {path}", error=BadInput)


def _kwargs_json(text: str, flag: str, values: dict[str, Any]) -> dict[str, Any]:
    from safety.inputs import parse_json

    cfg = parse_json(text, flag, BadInput)
    if not isinstance(cfg, dict):
        raise BadInput(f"{flag}: expected a JSON object of keyword arguments, got "
                       f"{type(cfg).__name__}")
    return cfg


#: a field's `parse` name -> (what the command line takes, its value as the field's): each
#: applied to every value of a repeatable option
PARSERS: dict[str, tuple[type, Callable[[str, str, dict[str, Any]], Any]]] = {
    "shape": (str, _shape), "file": (str, _file), "diagnosis": (str, _diagnosis),
    "candidate": (str, _candidate), "kwargs_json": (str, _kwargs_json),
}


def _meta(field: Any) -> dict[str, Any]:
    extra = field.json_schema_extra
    return extra if isinstance(extra, dict) else {}


def _bounds(field: Any) -> tuple[Optional[float], Optional[float]]:
    """The field's range; a strict bound as inclusive (finite() lets it in, the model refuses
    it with its own message)."""
    lo = hi = None
    for m in field.metadata:
        if isinstance(m, annotated_types.Ge):
            lo = m.ge
        elif isinstance(m, annotated_types.Gt):
            lo = m.gt
        elif isinstance(m, annotated_types.Le):
            hi = m.le
        elif isinstance(m, annotated_types.Lt):
            hi = m.lt
    return lo, hi


def _cli_type(field: Any, parse: Optional[str]) -> Any:
    """The type typer parses: the field's, with a Literal as str (the model names the choices)
    and a parsed field as what its parser takes."""
    ann = field.annotation
    optional = type(None) in typing.get_args(ann)
    inner = next((a for a in typing.get_args(ann) if a is not type(None)), ann) if optional else ann
    if parse:
        base: Any = PARSERS[parse][0]
        inner = list[base] if typing.get_origin(inner) is list else base
    elif typing.get_origin(inner) is typing.Literal:
        inner = str
    return Optional[inner] if optional else inner


def option_parameters(model: type) -> list[inspect.Parameter]:
    """One keyword parameter per field that has a flag, named as the field, its default a
    typer.Option made from the field."""
    params = []
    fields = sorted(model.model_fields.items(), key=lambda f: not f[1].is_required())
    for name, field in fields:
        meta = _meta(field)
        if "flag" not in meta:
            continue
        typ = _cli_type(field, meta.get("parse"))
        decl = meta["flag"]
        if bool in typing.get_args(typ):  # Optional[bool]: unset, --x or --no-x
            decl = f"{decl}/--no-{decl.removeprefix('--')}"
        kw: dict[str, Any] = {"help": field.description, "metavar": meta.get("metavar")}
        lo, hi = _bounds(field)
        if float in (typ, *typing.get_args(typ)):
            kw["callback"] = finite(lo, hi)
        elif int in (typ, *typing.get_args(typ)):  # shown in the help as [x>=1]
            gt = any(isinstance(m, annotated_types.Gt) for m in field.metadata)
            kw.update(min=None if lo is None else int(lo) + gt,
                      max=None if hi is None else int(hi))
        default = ... if field.is_required() else field.default
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY,
                                        default=typer.Option(default, decl, **kw),
                                        annotation=typ))
    return params


def options_from(model: type, op: str, typed: dict[str, Any]) -> Any:
    """The model built from what was typed: each parsed field through its parser first."""
    values = dict(typed)
    for name, field in model.model_fields.items():
        parse, raw = _meta(field).get("parse"), values.get(name)
        if parse and raw is not None:
            fn = PARSERS[parse][1]
            flag = _meta(field)["flag"]
            values[name] = ([fn(v, flag, values) for v in raw] if isinstance(raw, list)
                            else fn(raw, flag, values))
    return model.parse(op, {k: v for k, v in values.items() if k in model.model_fields})


def model_command(model: type, op: str, show: Callable[[dict[str, Any], Any], None],
                   doc: str, prepare: Optional[Callable[[dict[str, Any]], None]] = None,
                   failed: Callable[[dict[str, Any]], bool] = lambda res: False
                   ) -> Callable[..., None]:
    """A typer command running operation `op` with `model`'s options: `--json` prints the
    result, else `show(result, options)`. `prepare(typed)` adds what the command line knows
    before the parsers run; `failed(result)`: exit 1 (a rejected candidate)."""
    def command(ctx: typer.Context, as_json: bool = False, **typed: Any) -> None:
        if prepare is not None:
            prepare(typed)
        o = options_from(model, op, typed)
        res = invoke(settings(ctx), op, options=o)
        if as_json:
            print(json.dumps(res, indent=2, default=str))
        else:
            show(res, o)
        if failed(res):
            raise typer.Exit(1)

    ctx_param = inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                  annotation=typer.Context)
    as_json = inspect.Parameter("as_json", inspect.Parameter.KEYWORD_ONLY, annotation=bool,
                                default=typer.Option(False, "--json", help="Print JSON."))
    command.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [ctx_param, *option_parameters(model), as_json])
    command.__doc__ = doc
    command.__name__ = f"{op}_cmd"
    return command
