"""Operations: what the CLI and the daemon's control socket both run.

A command calls `invoke(settings, "status", json=True)`. When a daemon is running (its control
socket exists under the run dir), the request goes to it (the daemon holds the writer lock and
the monitors); otherwise the registered function runs in this process. Every operation takes
keyword arguments that are JSON values and returns a JSON-able dict, so both paths are the same.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

OpFunc = Callable[..., dict[str, Any]]
_OPS: dict[str, OpFunc] = {}
#: modules that register operations on import (kept lazy: importing them must stay cheap)
OP_MODULES = ["tuner.ops_safety", "tuner.ops_profile", "tuner.ops_trials", "tuner.ops_search"]


def operation(name: str) -> Callable[[OpFunc], OpFunc]:
    def deco(fn: OpFunc) -> OpFunc:
        _OPS[name] = fn
        return fn

    return deco


def _load() -> None:
    import importlib

    for m in OP_MODULES:
        try:
            importlib.import_module(m)
        except ModuleNotFoundError as e:
            if e.name != m:
                raise


def get(name: str) -> OpFunc:
    if name not in _OPS:
        _load()
    return _OPS[name]


def names() -> list[str]:
    _load()
    return sorted(_OPS)


def run_dir() -> Path:
    return Path(os.environ.get("METALTUNE_RUN_DIR", "/run/metaltune"))


def invoke(settings: Any, name: str, **kwargs: Any) -> dict[str, Any]:
    """Run operation `name` through the daemon when one is running, else locally."""
    if not kwargs.pop("local", False):
        try:
            from tuner.daemon.client import try_call  # issue 7
        except ModuleNotFoundError:
            try_call = None
        if try_call is not None:
            res = try_call(name, kwargs)
            if res is not None:
                return res
    return get(name)(settings, **kwargs)
