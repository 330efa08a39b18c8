"""When the daemon may start a search on its own: inside a maintenance window, after the GPUs
have been idle long enough, not more often than configured, and never while another writer runs."""
from __future__ import annotations

import datetime as dt
import time
from typing import Any, Optional

from tuner.daemon.config import SearchConfig


def in_window(windows: list[str], now: Optional[dt.datetime] = None) -> bool:
    """True inside any "HH:MM-HH:MM" window (local time; a window may wrap midnight). No windows:
    always."""
    if not windows:
        return True
    now = now or dt.datetime.now()
    m = now.hour * 60 + now.minute
    for w in windows:
        a, b = w.split("-")
        start = int(a[:2]) * 60 + int(a[3:])
        end = int(b[:2]) * 60 + int(b[3:])
        if (start <= m < end) if start <= end else (m >= start or m < end):
            return True
    return False


class IdleTracker:
    """How long every GPU has been below the utilisation threshold (from the health samples)."""

    def __init__(self) -> None:
        self.idle_since: Optional[float] = None

    def update(self, gpus: list[dict[str, Any]], threshold_pct: int, now: Optional[float] = None) -> None:
        now = time.monotonic() if now is None else now
        utils = [g["util_pct"] for g in gpus if "util_pct" in g]
        idle = bool(utils) and all(u <= threshold_pct for u in utils)
        if not idle:
            self.idle_since = None
        elif self.idle_since is None:
            self.idle_since = now

    def idle_for(self, now: Optional[float] = None) -> float:
        if self.idle_since is None:
            return 0.0
        return (time.monotonic() if now is None else now) - self.idle_since


def search_due(cfg: SearchConfig, idle: IdleTracker, last_started: Optional[float],
               now_wall: Optional[float] = None, now_local: Optional[dt.datetime] = None) -> tuple[bool, str]:
    """(may start, why not). `last_started` is a wall-clock time (persisted across restarts)."""
    if not cfg.enabled:
        return False, "search disabled in config"
    if not in_window(cfg.windows, now_local):
        return False, "outside the maintenance window"
    now_wall = time.time() if now_wall is None else now_wall
    if last_started is not None and now_wall - last_started < cfg.min_interval_s:
        return False, "a search ran recently (search.min_interval_s)"
    if cfg.only_when_idle and idle.idle_for() < cfg.idle_for_s:
        return False, "GPUs not idle long enough"
    return True, ""
