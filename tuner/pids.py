"""Whether a process is alive, by pid (signal 0: nothing is sent)."""
from __future__ import annotations

import os
from typing import Any


def alive(pid: Any) -> bool:
    """True for a live process (one of another user's too: EPERM means it exists)."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
