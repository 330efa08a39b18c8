"""What every command module uses: the Settings of this invocation and `invoke`, which runs an
operation through the daemon when one is running, else in this process."""
from __future__ import annotations

from typing import Any

import typer

from tuner.ops.settings import Settings


def settings(ctx: typer.Context) -> Settings:
    obj = ctx.find_root().obj
    assert isinstance(obj, Settings)
    return obj


def invoke(settings: Settings, name: str, **kwargs: Any) -> dict[str, Any]:
    """Run operation `name` through the daemon when one is running (its control socket exists
    under the run dir: the daemon holds the writer lock and the monitors), else locally."""
    from tuner import ops

    if not kwargs.pop("local", False):
        from tuner.daemon.client import try_call

        res = try_call(name, kwargs)
        if res is not None:
            return res
    from tuner.ops.args import validate

    fn = ops.get(name)
    try:
        return fn(settings, **validate(name, fn, kwargs))
    except OSError as e:
        # a state dir that is read-only or full, a file that vanished: the OS's reason, one line
        from tuner.errors import OperationFailed

        where = f"{e.filename}: " if e.filename else ""
        raise OperationFailed(f"{name}: {where}{e.strerror or e}") from None
