"""The fault the canary tests plant: the installed stored source (tests.kernelsearch.test_store's
SRC) turns wrong in use, after it was judged and installed."""
from __future__ import annotations

import sys
from typing import Callable

from kernelsearch.harness import sandbox
from tests.kernelsearch.test_store import SRC


def go_wrong() -> Callable[[], None]:
    """From now on the installed source's launch writes twice the right answer; returns the
    undo."""
    mod = sys.modules[sandbox.module_name(SRC)]
    real = mod._scale

    class Doubling:
        def __getitem__(self, grid):
            def launch(X, W, Y, *a, **k):
                real[grid](X, W, Y, *a, **k)
                Y.mul_(2.0)
            return launch

    mod._scale = Doubling()
    return lambda: setattr(mod, "_scale", real)
