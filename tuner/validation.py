"""One way to turn a pydantic ValidationError into the one line a user reads: the field, what was
expected, how many more errors there were. A value is shown only where asked for, never for an
unknown field (a misspelt `pasword:` is still a password) nor for a field named like a secret."""
from __future__ import annotations

from typing import Any, Mapping, Optional

SECRET_WORDS = ("pass", "secret", "token", "key", "cred", "auth")


def loc(err: Mapping[str, Any], top: str = "(top level)") -> str:
    return ".".join(str(p) for p in err.get("loc", ())) or top


def first_error(e: Any, *, unknown: str = "unknown field", show_value: bool = False,
                top: str = "(top level)", names: Optional[Mapping[str, str]] = None,
                label: str = "field", more: bool = True) -> str:
    """`field a.b: message[ (got v)][ (and N more)]` for the first error of `e`.

    `names` maps a top-level field to the name the user typed it as (a CLI flag); `top` names
    an error of the whole object (a model validator's), "" for the bare message."""
    errs = e.errors()
    err = errs[0]
    field = loc(err, top)
    if names and err.get("loc") and str(err["loc"][0]) in names:
        field = f"{field} ({names[str(err['loc'][0])]})"
    msg = str(err["msg"]).removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        msg = unknown
    got = ""
    if show_value and err["type"] not in ("extra_forbidden", "missing"):
        name = str((err.get("loc") or ("",))[-1]).lower()
        value = err.get("input")
        if not any(w in name for w in SECRET_WORDS) and not isinstance(value, (dict, list)):
            shown = repr(value)
            got = f" (got {shown if len(shown) <= 60 else shown[:57] + '...'})"
    tail = f" (and {len(errs) - 1} more)" if more and len(errs) > 1 else ""
    return f"{label} {field}: {msg}{got}{tail}" if field else f"{msg}{tail}"
