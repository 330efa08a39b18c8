"""The probation countdown `apply` shows while it waits: read from the journal (read-only), so it
is the same whether the apply runs in this process or in the daemon. On a terminal a transient
progress bar; otherwise one line per state change (logs and CI stay readable)."""
from __future__ import annotations

import sys
import threading
import time
from typing import Any, Optional

from tuner.ops.settings import Settings

POLL_S = 0.2


def _imports(tty: bool) -> None:
    """Everything the view's thread runs, imported in the caller's thread before it starts.
    Why: a Ctrl-C that lands in importlib's module-lock cleanup (a weakref callback, which
    swallows the KeyboardInterrupt) leaves the global import lock held by the main thread; a
    view thread importing at that moment waits for it for good while the main thread waits for
    the module the view is importing: `apply` hung after Ctrl-C, with nothing printed."""
    import safety.journal  # noqa: F401 - with journal_reads, anchor, securefs, sqlite3
    import tuner.ops.probation  # noqa: F401
    import tuner.ops.safety  # noqa: F401

    if tty:
        import rich.console  # noqa: F401
        import rich.progress  # noqa: F401


class ProbationView:
    """Watch for the newest transaction whose label starts with `label`, begun after this
    view started, until stopped."""

    def __init__(self, settings: Settings, label: str, stream: Any = None):
        self.settings = settings
        self.label = label
        self.since = time.time() - 1.0
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._seen: Optional[str] = None
        self._bar_: Any = None

    def __enter__(self) -> "ProbationView":
        _imports(self.tty)
        self._thread = threading.Thread(target=self._run, name="probation-view", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)

    def _txn(self) -> Optional[dict[str, Any]]:
        from tuner.ops.safety import journal_to_read

        try:
            j = journal_to_read(self.settings)
        except Exception:  # noqa: BLE001 - a journal being created: look again
            return None
        if j is None:
            return None
        try:
            return next((t for t in j.txns(5) if (t["label"] or "").startswith(self.label)
                         and t["created"] >= self.since), None)
        except Exception:  # noqa: BLE001
            return None
        finally:
            j.close()

    def _run(self) -> None:
        try:
            while not self._stop.wait(POLL_S):
                if self._step():
                    return
            self._step()  # the apply returned: its last state change is in the journal now
        finally:
            if self._bar_ is not None:
                self._bar_.stop()

    def _step(self) -> bool:
        """Show what changed; True once the transaction is resolved."""
        t = self._txn()
        if t is None:
            return False
        if t["state"] != self._seen:
            if self._seen is None and t["state"] != "intent":
                # the write went by between two polls: every transaction passes through it
                self._line(dict(t, state="intent"))
            self._seen = t["state"]
            if self._bar_ is not None and self._seen != "probation":
                self._bar_.stop()
                self._bar_ = None
            self._line(t)
            if self._seen == "probation" and self.tty:
                self._bar_ = self._bar(t)
        if self._bar_ is not None:
            self._tick(self._bar_, t)
        return self._seen in ("confirmed", "rolled_back", "rollback_failed")

    def _end(self, t: dict[str, Any]) -> tuple[float, float]:
        """(seconds of probation, when apply confirms): the journal's deadline includes a grace."""
        from tuner.ops.probation import watch_of

        total = float(t["probation_s"] or 0)
        watch = watch_of(total)
        return watch, float(t["deadline"] or time.time()) - (total - watch)

    def _line(self, t: dict[str, Any]) -> None:
        st = t["state"]
        if st == "intent":
            msg = f"transaction {t['id']}: writing the changes"
        elif st == "probation":
            watch, _ = self._end(t)
            msg = (f"transaction {t['id']}: in probation for {watch:.0f}s under the health "
                   "monitors (`metaltune confirm` keeps it now, `metaltune rollback` undoes it)")
        elif st == "confirmed":
            msg = f"transaction {t['id']}: confirmed ({t['reason']})"
        else:
            msg = f"transaction {t['id']}: {st.replace('_', ' ')} ({t['reason']})"
        if self.tty:
            from rich.console import Console

            Console(file=self.stream).print(msg, highlight=False, markup=False)
        else:
            print(msg, file=self.stream, flush=True)

    def _bar(self, t: dict[str, Any]) -> Any:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

        watch, _ = self._end(t)
        bar = Progress(TextColumn("probation"), BarColumn(), TimeRemainingColumn(),
                       console=Console(file=self.stream), transient=True)
        bar.add_task("probation", total=max(watch, 0.001))
        bar.start()
        return bar

    def _tick(self, bar: Any, t: dict[str, Any]) -> None:
        watch, end = self._end(t)
        bar.update(bar.task_ids[0], completed=max(0.0, min(watch, watch - (end - time.time()))))
