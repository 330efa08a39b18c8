"""Structured, greppable log lines on stdout (the journal under systemd).

One event per line: `ts=... level=info event=change.applied knob=gpu0.power_limit_w value=500
reason="profile h200"`. Values that contain spaces, quotes or `=` are JSON-quoted, lists and dicts
are compact JSON, so `grep event=rollback` or `grep knob=gpu0.` finds what an operator looks for.
Under systemd (JOURNAL_STREAM set) each line also carries a `<N>` syslog priority prefix, which
journald turns into the entry's priority.
"""
from __future__ import annotations

import json
import logging
import os
import re
import sys
import threading
import time
from typing import Any, TextIO

from tuner import redact

_PRIO = {"debug": 7, "info": 6, "notice": 5, "warning": 4, "error": 3, "critical": 2}
_BARE = re.compile(r"^[A-Za-z0-9_.:/@+,\-\[\]]+$")
_lock = threading.Lock()
_stream: TextIO | None = None
_min_level = "info"


def configure(level: str = "info", stream: TextIO | None = None) -> None:
    global _stream, _min_level
    _stream = stream
    _min_level = level if level in _PRIO else "info"
    # route library logging (safety, knobs) into the same key=value lines
    root = logging.getLogger()
    for h in list(root.handlers):
        if isinstance(h, _Handler):
            root.removeHandler(h)
    root.addHandler(_Handler())
    root.setLevel(logging.DEBUG if _min_level == "debug" else logging.INFO)


def unconfigure() -> None:
    """Take the handler off the root logger again (for code that configured logging in a
    process that goes on doing other things, e.g. a test)."""
    global _stream
    _stream = None
    root = logging.getLogger()
    for h in list(root.handlers):
        if isinstance(h, _Handler):
            root.removeHandler(h)
    root.setLevel(logging.WARNING)


def fmt_value(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (list, tuple, dict)):
        return json.dumps(json.dumps(v, separators=(",", ":"), sort_keys=True, default=str))
    s = str(v)
    return s if s and _BARE.match(s) else json.dumps(s)


def format_line(event: str, level: str = "info", **kv: Any) -> str:
    ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
    parts = [f"ts={ts}Z", f"level={level}", f"event={event}"]
    parts += [f"{k}={fmt_value(v)}" for k, v in kv.items()]
    return " ".join(parts)


def log(event: str, level: str = "info", **kv: Any) -> None:
    if _PRIO.get(level, 6) > _PRIO[_min_level]:
        return
    line = redact.text(format_line(event, level, **kv))  # never a credential in the journal
    if os.environ.get("JOURNAL_STREAM"):
        line = f"<{_PRIO.get(level, 6)}>{line}"
    out = _stream or sys.stdout
    with _lock:
        try:
            out.write(line + "\n")
            out.flush()
        except (OSError, ValueError):  # stdout gone (journald restarted): never kill the daemon
            pass


def _reinit_after_fork() -> None:
    # a forked child (safety's watchdog) must not inherit this lock held by another thread
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_reinit_after_fork)


class _Handler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        level = record.levelname.lower()
        level = "warning" if level == "warn" else level
        try:
            msg = record.getMessage()
        except Exception:
            msg = str(record.msg)
        log("log", level if level in _PRIO else "info", logger=record.name, msg=msg)


def summary(res: Any) -> dict[str, Any]:
    """The greppable essentials of an operation's result (no big blobs in the log)."""
    if not isinstance(res, dict):
        return {}
    out: dict[str, Any] = {}
    for k in ("ok", "txn", "transaction", "state", "reason", "result", "applied", "changes", "restored",
              "confirmed", "run_id", "best", "gain", "trials", "mismatches", "error"):
        v = res.get(k)
        if v is None:
            continue
        if isinstance(v, list) and len(v) > 20:
            v = f"{len(v)} items"
        elif isinstance(v, dict) and len(json.dumps(v, default=str)) > 400:
            v = f"{len(v)} entries"
        out[k if k not in ("state",) else "result_state"] = v
    if "recovered" in res and isinstance(res["recovered"], list):
        out["recovered"] = len(res["recovered"])
    return out
