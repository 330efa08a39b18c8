"""How help reads, the way other Unix tools write it: a flag is shown as `--json`, not
`--json <bool>`; a positional argument as `PROFILE`, not `{profile} <str>`. Typer 0.29 prints
the Python type of every parameter; these overrides drop it where it says nothing (a flag, an
argument whose name already says what it is). Applied once, when the CLI is imported."""
from __future__ import annotations

from typing import Any

from typer import core


def _option_type(self: Any, ctx: Any) -> Any:
    if self.is_flag and self.metavar is None:
        return None
    return _ORIG_OPTION(self, ctx)


def _argument_name(self: Any) -> str:
    return self.metavar if self.metavar is not None else (self.name or "").upper()


def _argument_type(self: Any, ctx: Any) -> Any:
    return None


def _argument_usage(self: Any) -> str:
    name = _argument_name(self)
    if self.nargs != 1 and self.metavar is None:
        name += "..."
    return name if self.required else f"[{name}]"


_ORIG_OPTION = core.TyperOption.display_type_rich


def apply() -> None:
    core.TyperOption.display_type_rich = _option_type  # type: ignore[method-assign]
    core.TyperArgument.display_name_raw = property(_argument_name)  # type: ignore[assignment]
    core.TyperArgument.display_type_rich = _argument_type  # type: ignore[method-assign]
    core.TyperArgument._usage_display_name = _argument_usage  # type: ignore[method-assign]
