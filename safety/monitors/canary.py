"""Canary: a small known workload run again and again during probation; it must return the
right answer within its timeout. `mode="process"` runs it in a forked child that is killed on
timeout (for code that can hang inside C); `mode="thread"` for callables that cannot be forked."""
from __future__ import annotations

import threading
import time
from typing import Any, Callable, Optional

from safety.incident import Incident
from safety.monitors.base import Monitor

_UNSET = object()


class CanaryMonitor(Monitor):
    name = "canary"

    def __init__(self, fn: Callable[[], Any], *, expected: Any = _UNSET,
                 check: Optional[Callable[[Any], bool]] = None, timeout_s: float = 5.0,
                 interval_s: float = 1.0, mode: str = "thread"):
        if mode not in ("thread", "process"):
            raise ValueError("mode: 'thread' or 'process'")
        self.fn, self.expected, self.check = fn, expected, check
        self.timeout_s, self.interval_s, self.mode = timeout_s, interval_s, mode
        self._run: Optional[dict[str, Any]] = None
        self._last_start = -1e9
        self.runs = 0

    def _start(self) -> None:
        now = time.monotonic()
        self._last_start = now
        self.runs += 1
        if self.mode == "thread":
            box: dict[str, Any] = {"t0": now}
            done = threading.Event()

            def target() -> None:
                try:
                    box["result"] = self.fn()
                except BaseException as e:  # reported as a failed canary
                    box["error"] = f"{type(e).__name__}: {e}"
                done.set()

            box["done"] = done
            threading.Thread(target=target, daemon=True, name="safety-canary").start()
            self._run = box
        else:
            import multiprocessing as mp

            ctx = mp.get_context("fork")
            r, w = ctx.Pipe(duplex=False)

            def child() -> None:
                try:
                    w.send(("ok", self.fn()))
                except BaseException as e:
                    w.send(("error", f"{type(e).__name__}: {e}"))

            p = ctx.Process(target=child, daemon=True)
            p.start()
            w.close()
            self._run = {"t0": now, "proc": p, "pipe": r}

    def _finished(self) -> Optional[tuple[bool, Any]]:
        """(ok, result-or-error) when the running canary finished, else None."""
        run = self._run
        if run is None:
            return None
        if self.mode == "thread":
            if not run["done"].is_set():
                return None
            return ("error" not in run), run.get("result", run.get("error"))
        if run["pipe"].poll():
            try:
                kind, val = run["pipe"].recv()
            except EOFError:
                kind, val = "error", "canary process died"
            run["proc"].join(timeout=1)
            return kind == "ok", val
        if not run["proc"].is_alive():
            return False, f"canary process exited with code {run['proc'].exitcode}"
        return None

    def _correct(self, value: Any) -> bool:
        if self.check is not None:
            return bool(self.check(value))
        if self.expected is not _UNSET:
            return value == self.expected
        return True

    def arm(self) -> None:
        self.stop()  # a run left from an earlier transaction does not count for this one
        self._last_start = -1e9  # first run at the first poll

    def stop(self) -> None:
        """End the run in flight (process mode: kill and reap it, so the GPU is idle again and no
        zombie looks like a live tenant); a thread cannot be stopped and is abandoned."""
        run, self._run = self._run, None
        if run is not None and self.mode == "process":
            run["proc"].kill()
            run["proc"].join(timeout=2)
            run["pipe"].close()

    def poll(self) -> list[Incident]:
        out = []
        fin = self._finished()
        if fin is not None:
            ok, val = fin
            self._run = None
            if not ok:
                out.append(self.incident("canary_failed", "fatal", f"canary raised: {val}"))
            elif not self._correct(val):
                out.append(self.incident("canary_failed", "fatal",
                                         f"canary answered {val!r}, wrong"))
        elif self._run is not None and time.monotonic() - self._run["t0"] > self.timeout_s:
            out.append(self.incident("canary_hang", "fatal",
                                     f"canary did not finish within {self.timeout_s:g}s"))
            self.stop()  # a hung thread is abandoned (daemon thread)
        if self._run is None and not out and time.monotonic() - self._last_start >= self.interval_s:
            self._start()
        return out

    def close(self) -> None:
        self.stop()
