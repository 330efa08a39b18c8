"""What every command module uses: the Settings of this invocation and `invoke`, which runs an
operation through the daemon when one is running, else in this process."""
from __future__ import annotations

import inspect
from typing import Any, Callable

import typer

from tuner.ops.settings import Settings


def settings(ctx: typer.Context) -> Settings:
    obj = ctx.find_root().obj
    assert isinstance(obj, Settings)
    return obj


def invoke(settings: Settings, name: str, options: Any = None, **kwargs: Any) -> dict[str, Any]:
    """Run operation `name` through the daemon when one is running (its control socket exists
    under the run dir: the daemon holds the writer lock and the monitors), else locally.

    `options`: the operation's options model, built by the caller (a search command): the
    daemon gets its arguments as JSON and builds its own; here it runs as built, once."""
    from tuner import ops

    local = kwargs.pop("local", False)
    if options is not None:
        kwargs = options.sent()
    if not local:
        from tuner.daemon.client import try_call

        res = try_call(name, kwargs)
        if res is not None:
            return res
    from tuner.ops.args import call

    fn = ops.get(name)
    try:
        if options is not None:
            return fn.run(settings, options)  # type: ignore[attr-defined]
        return call(name, fn, settings, kwargs)
    except OSError as e:
        # a state dir that is read-only or full, a file that vanished: the OS's reason, one line
        from tuner.errors import OperationFailed

        where = f"{e.filename}: " if e.filename else ""
        raise OperationFailed(f"{name}: {where}{e.strerror or e}") from None


#: (command function, parameter, text): help made from a registry when the command line is built
_LIVE_HELP: list[tuple[Callable[..., Any], str, Callable[[], str]]] = []


def live_help(fn: Callable[..., Any], param: str, text: Callable[[], str]) -> None:
    """`param`'s help is `text()` as the registry is when the command line is built, so a
    family, workload or proposer registered later is listed without editing the help."""
    _LIVE_HELP.append((fn, param, text))


def refresh_help() -> None:
    for fn, param, text in _LIVE_HELP:
        inspect.signature(fn).parameters[param].default.help = text()
