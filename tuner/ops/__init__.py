"""Operations: what the CLI and the daemon's control socket both run.

Each operation is a function registered with `@operation("name")` (tuner.ops.registry) in one of
the OP_MODULES; it takes the Settings (tuner.ops.settings) and keyword arguments that are JSON
values, and returns a JSON-able dict, so a call through the daemon's socket and a call in this
process are the same. `tuner.cli.common.invoke` picks between the two.
"""
from __future__ import annotations

import importlib

from tuner.ops.registry import OPS, READS, OpFunc

#: modules that register operations on import (kept lazy: importing them must stay cheap)
OP_MODULES = ["tuner.ops.safety", "tuner.ops.profile", "tuner.ops.apply", "tuner.ops.trials",
              "tuner.ops.search", "tuner.ops.kernel_check", "tuner.ops.boot", "tuner.ops.recommend",
              "tuner.ops.set_knob"]


def _load() -> None:
    # a module that fails to import (a stale path after a rename) fails loudly here
    for m in OP_MODULES:
        importlib.import_module(m)


def get(name: str) -> OpFunc:
    if name not in OPS:
        _load()
    return OPS[name]


def names() -> list[str]:
    _load()
    return sorted(OPS)


def reads() -> frozenset[str]:
    """The operations that only read (registered with `reads=True`)."""
    _load()
    return frozenset(READS)
