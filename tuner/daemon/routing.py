"""Request routing for the control socket: which operation runs how.

- `daemon` and `search_stop` are the daemon's own; the searches start a child (SearchRunner),
  their arguments checked by their options model first, so bad input starts nothing;
- operations registered `reads=True` run at once, concurrently, without the writer lock (those
  that load torch or triton, CHILD_READS, in a child of the daemon);
- every other operation is a write: only while the daemon runs and no search does, one at a
  time under the writer lock, logged, and followed by a look at the journal.
A client's arguments are always checked by the operation's model (tuner.ops.args), the one the
CLI's local path uses."""
from __future__ import annotations

import inspect
import threading
from typing import Any, Callable

from tuner import ops
from tuner.daemon import child_reads, logs
from tuner.daemon.child_reads import CHILD_READS
from tuner.daemon.searches import SEARCH_OPS, brief
from tuner.errors import BadInput, MetaltuneError, OperationFailed
from tuner.ops.args import call, validate

#: how long a write request waits for another write (or a search) before "busy"
WRITE_WAIT_S = 30.0
DAEMON_OPS = ("daemon", "search_stop")


class Router:
    def __init__(self, settings: Callable[[], Any], config: Callable[[], Any],
                 phase: Callable[[], str], info: Callable[[], dict[str, Any]], searches: Any,
                 writer: threading.RLock, changed: Callable[[], None]):
        """`changed`: after a write (log the journal's news, metrics, status)."""
        self.settings, self.config, self.phase, self.info = settings, config, phase, info
        self.searches, self.writer, self.changed = searches, writer, changed
        self.inflight = 0  # write requests being served (answered before the daemon exits)
        self.inflight_cv = threading.Condition()

    def handle(self, op: str, args: dict[str, Any], peer: Any) -> dict[str, Any]:
        if op == "daemon":
            return self.info()
        if op in SEARCH_OPS:
            self._running()
            return self.searches.request(op, validate(op, ops.get(op), args), WRITE_WAIT_S)
        if op == "search_stop":
            return {"stopped": self.searches.stop("stopped by the operator")}
        try:
            fn = ops.get(op)
        except KeyError:
            raise BadInput(f"unknown operation {op!r}; the daemon serves: "
                           f"{', '.join(sorted(set(ops.names()) | set(DAEMON_OPS)))}") from None
        policy = self.config().policy
        if policy is not None and args.get("policy") is None and _takes(fn, "policy"):
            args = {**args, "policy": str(policy)}  # the host's allowed-change list
        if op in CHILD_READS:  # heavy imports: in a child, the daemon stays small
            return child_reads.run(op, validate(op, fn, args))
        if op in ops.reads():
            res = call(op, fn, self.settings(), args)
            if op == "status" and isinstance(res, dict):
                res = {**res, "daemon": self.info()}
            return res
        self._running()
        if self.searches.running:
            raise OperationFailed(f"busy: a search is running (pid {self.searches.pid}); "
                                  "wait for it, or stop it (operation search_stop)")
        with self.inflight_cv:
            self.inflight += 1
        try:
            return self._write(fn, op, args, peer)
        finally:
            with self.inflight_cv:
                self.inflight -= 1
                self.inflight_cv.notify_all()

    def wait_idle(self, timeout: float) -> None:
        """Until every write request in flight has its answer (or `timeout`)."""
        with self.inflight_cv:
            self.inflight_cv.wait_for(lambda: self.inflight == 0, timeout=timeout)

    def _running(self) -> None:
        if self.phase() != "running":
            raise OperationFailed(f"the daemon is {self.phase()}; try again when it runs")

    def _write(self, fn: Any, op: str, args: dict[str, Any], peer: Any) -> dict[str, Any]:
        if not self.writer.acquire(timeout=WRITE_WAIT_S):
            raise OperationFailed("busy: another write is in progress; try again")
        try:
            logs.log("request", op=op, uid=peer.uid, pid=peer.pid, args=brief(args))
            try:
                res = call(op, fn, self.settings(), args)
            except Exception as e:
                self.changed()
                logs.log("request.failed", level="warning", op=op, error=f"{type(e).__name__}: {e}")
                if not isinstance(e, MetaltuneError) and hasattr(e, "exit_code"):
                    raise as_metaltune(e) from None
                raise
            logs.log("request.done", op=op, uid=peer.uid, **logs.summary(res))
            self.changed()
            return res
        finally:
            self.writer.release()


def as_metaltune(e: BaseException) -> MetaltuneError:
    """An error that carries an exit code (safety's) as the tuner error of that code."""
    code = getattr(e, "exit_code", 1)
    return BadInput(str(e)) if code == 2 else OperationFailed(str(e))


def _takes(fn: Any, name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
