"""The plugin's record of itself, for a user or a test outside the engine's processes:
`METALTUNE_VLLM_COUNT=PATH` makes every engine process that loads the plugin append JSON lines
to PATH:

    {"event": "loaded", "pid": ..., "table": ..., "replaced": [...]}   at registration
    {"event": "calls", "pid": ..., "calls": {"rmsnorm": N, ...}}        while its ops run
    {"event": "canary", "pid": ..., "incident": {...}}                  a kernel the canary removed

A "calls" line is written from a daemon thread at most every `INTERVAL_S` while the counts
change, and at exit: the model's hot path only increments dispatch's counters. The counts are
totals for that process (the last line of a pid is its latest). The file is opened with
O_NOFOLLOW (a symlink planted at PATH is refused, never followed), created owner-only, and each
line is one O_APPEND write, so processes appending at once never interleave."""
from __future__ import annotations

import atexit
import json
import os
import threading
from pathlib import Path
from typing import Any, Optional

INTERVAL_S = 0.5

_path: Optional[Path] = None
_last: dict[str, int] = {}
_thread: Optional[threading.Thread] = None
_lock = threading.Lock()


def append(path: Path, record: dict[str, Any]) -> None:
    """One JSON line, one write; never through a symlink."""
    line = (json.dumps(record, sort_keys=True, default=str) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def read(path: Path) -> list[dict[str, Any]]:
    """Every line of a count file (a line that is not JSON is skipped)."""
    out = []
    for line in Path(path).read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def totals(path: Path) -> dict[str, int]:
    """Calls per family over every process: each pid's last "calls" line, summed."""
    last: dict[int, dict[str, int]] = {}
    for r in read(path):
        if r.get("event") == "calls":
            last[int(r["pid"])] = dict(r["calls"])
    out: dict[str, int] = {}
    for calls in last.values():
        for k, v in calls.items():
            out[k] = out.get(k, 0) + int(v)
    return out


def flush() -> None:
    """Write this process's counts if they changed since the last line."""
    from kernelsearch import dispatch

    if _path is None:
        return
    with _lock:
        now = dispatch.calls()
        if now == _last:
            return
        try:
            append(_path, {"event": "calls", "pid": os.getpid(), "calls": now})
        except OSError:
            return  # the record is best effort; the engine never fails for it
        _last.clear()
        _last.update(now)


def _loop(stop: threading.Event) -> None:
    while not stop.wait(INTERVAL_S):
        flush()


def _start() -> None:
    global _thread
    _last.clear()  # a forked child starts its own record (it inherits its parent's counts)
    stop = threading.Event()
    _thread = threading.Thread(target=_loop, args=(stop,), name="metaltune-vllm-count",
                               daemon=True)
    _thread.start()


def start(path: Path) -> None:
    """Record to `path` from now on (once per process; a forked child starts its own thread,
    since threads do not survive fork and vLLM forks its engine processes)."""
    global _path
    if _path is not None:
        return
    _path = Path(path)
    _start()
    atexit.register(flush)
    os.register_at_fork(after_in_child=_start)
