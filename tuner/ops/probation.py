"""How `apply` waits out a probation: until its end, or until the journal says the change was
confirmed (`metaltune confirm`) or rolled back (`metaltune rollback`, the watchdog, an incident)
from elsewhere, whichever comes first. `detach` runs the wait in the background for
`apply --no-wait`, so the caller returns as soon as the change is in probation.

The transaction's deadline is the watchdog's: it rolls back if nobody has confirmed by then (the
caller died or hung). So the caller watches for `watch` seconds and confirms inside a grace
period after it; `watch_of` recovers `watch` from the journal's probation_s for a viewer.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from typing import Any, Callable, Iterator, Optional

from tuner.ops.settings import NO_DAEMON_ENV

POLL_S = 0.25


def grace(watch: float) -> float:
    return max(2.0, 0.1 * watch)


def watch_of(total: float) -> float:
    """The inverse of `watch + grace(watch)`: what the caller waits, from the journal's value."""
    return total / 1.1 if total >= 22.0 else max(0.0, total - 2.0)


def wait(txn: Any, watch: float, reason: str) -> str:
    """Poll the monitors for `watch` seconds, then confirm. Returns who confirmed: "probation
    passed" or "confirmed elsewhere"; raises the transaction's SafetyError when it was rolled
    back (here on an incident, or elsewhere), and KeyboardInterrupt for a Ctrl-C that Python
    dropped (`ctrl_c_remembered`)."""
    end = time.monotonic() + watch
    while txn.state == "probation" and (left := end - time.monotonic()) > 0:
        _raise_if_ctrl_c()
        txn.check()  # notices a confirm or a rollback from another process in the journal
        time.sleep(min(POLL_S, max(0.01, left)))
    _raise_if_ctrl_c()  # never confirm after a Ctrl-C
    if txn.state == "confirmed":
        return "confirmed elsewhere"
    txn.confirm(reason)
    return "probation passed"


_ctrl_c = threading.Event()


@contextlib.contextmanager
def ctrl_c_remembered() -> Iterator[None]:
    """While an apply begins and waits: SIGINT also sets a flag that `wait` raises. Python
    raises KeyboardInterrupt in whatever code runs when it notices the signal; in code it calls
    from C (a __del__, a weakref callback such as importlib's module-lock cleanup, an at-fork
    hook) the KeyboardInterrupt is printed as "Exception ignored" and dropped, and the apply
    went on with its probation as if no Ctrl-C had come. Main thread only (signals go there)
    and only over Python's own handler; elsewhere (the daemon's request threads) a no-op."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return
    _ctrl_c.clear()

    def on_sigint(signum: int, frame: Any) -> None:
        _ctrl_c.set()
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        _ctrl_c.clear()


def _raise_if_ctrl_c() -> None:
    if _ctrl_c.is_set():
        _ctrl_c.clear()  # raised once: the rollback after it must not be interrupted by it
        raise KeyboardInterrupt


Started = Callable[[dict[str, Any]], None]


def detach(body: Callable[[Started], Any]) -> dict[str, Any]:
    """Run `body(started)` in the background and return what it passes to `started` (once the
    change is in probation); an error raised before that is raised here. Outside the daemon the
    background is a child process in its own session (it outlives this command and is the
    transaction's caller, so its watchdog stays armed); inside the daemon, which outlives the
    request, a thread."""
    if os.environ.get(NO_DAEMON_ENV):
        return _in_thread(body)
    r, w = os.pipe()
    # a Ctrl-C from here on is held until the parent reads the answer (and passes it on) or the
    # child is in a session of its own (and the terminal's Ctrl-C no longer reaches it)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    pid = os.fork()
    if pid == 0:  # the child: the rest of the apply, detached from the terminal
        code = 0
        report = _Report(w)
        try:
            os.close(r)
            os.setsid()
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            dn = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(dn, fd)

            def started(info: dict[str, Any]) -> None:
                report.send({"ok": info})

            body(started)
        except KeyboardInterrupt:  # before the transaction began (it translates its own)
            code = 1
            report.send({"error": "apply: interrupted (Ctrl-C) before anything was written",
                         "kind": "KeyboardInterrupt", "exit_code": INTERRUPTED})
        except BaseException as e:  # noqa: BLE001 - reported to the parent, then exit
            code = 1
            # after "started" the parent is gone and the journal has the outcome: say nothing
            report.send({"error": str(e), "kind": type(e).__name__,
                         "exit_code": getattr(e, "exit_code", 1)})
        finally:
            os._exit(code)
    os.close(w)
    data, ctrl_c = b"", False
    while not data.endswith(b"\n"):  # one line, or EOF
        try:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # a held Ctrl-C is raised here
            chunk = os.read(r, 65536)
        except KeyboardInterrupt:
            # the background is in a session of its own: the terminal's Ctrl-C reaches only
            # this process, which used to exit 130 while the background went on writing the
            # knobs and kept them (issue 42 item 8). Pass it on, once (a second one must not
            # interrupt the rollback): the background rolls back what it wrote (or stops
            # before writing) and answers how it ended.
            if not ctrl_c:
                _pass_ctrl_c(pid)
            ctrl_c = True
            continue
        if not chunk:
            break
        data += chunk
    os.close(r)
    if ctrl_c and b'"ok"' in data[:8]:
        # the Ctrl-C came as the "in probation" answer did: the background rolls it back
        return _reaped(pid, data)
    return _answer(data, pid)


INTERRUPTED = 130  # tuner.ops.apply_errors.Interrupted's exit code


def _pass_ctrl_c(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGINT)
    except ProcessLookupError:
        pass


def _reaped(pid: int, data: bytes, timeout: float = 60.0) -> dict[str, Any]:
    """Wait for the background to end after a Ctrl-C that came once it was in probation (it
    rolls back, then exits), and say so."""
    from tuner.ops.apply_errors import Interrupted

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if os.waitpid(pid, os.WNOHANG)[0]:
                break
        except ChildProcessError:
            break
        except KeyboardInterrupt:
            continue
        time.sleep(0.05)
    txn = json.loads(data).get("ok", {}).get("transaction")
    raise Interrupted(f"apply: interrupted (Ctrl-C) as transaction {txn} went into probation: "
                      "rolled back; `metaltune status` shows it")


class _Report:
    """The background's one line to the waiting `apply`, sent at most once. Once sent, the pipe's
    descriptor number is pointed at /dev/null rather than closed: a closed number is the next one
    open() returns, and SQLite reopening the journal got it, so a late error message written to
    "the pipe" landed in the first bytes of journal.db (issue 33)."""

    def __init__(self, fd: int):
        self.fd: Optional[int] = fd

    def send(self, msg: dict[str, Any]) -> None:
        fd, self.fd = self.fd, None
        if fd is None:
            return
        try:
            os.write(fd, json.dumps(msg, default=str).encode() + b"\n")
        except OSError:
            pass  # the parent is gone: the journal has the outcome
        finally:
            # (the watchdog forked meanwhile still holds a copy of the pipe: hence the \n)
            dn = os.open(os.devnull, os.O_WRONLY)
            os.dup2(dn, fd)  # releases the pipe, keeps the number taken
            os.close(dn)


def _answer(data: bytes, pid: int) -> dict[str, Any]:
    from tuner.errors import BadInput, OperationFailed

    try:
        msg = json.loads(data) if data else {}
    except ValueError:
        msg = {}
    if "ok" in msg:
        return {**msg["ok"], "background_pid": pid}
    if msg.get("exit_code") == INTERRUPTED:
        from tuner.ops.apply_errors import Interrupted

        raise Interrupted(msg.get("error") or "apply: interrupted (Ctrl-C)")
    err = BadInput if msg.get("exit_code") == 2 else OperationFailed
    raise err(msg.get("error") or f"apply: the background process {pid} ended before probation")


def _in_thread(body: Callable[[Started], Any]) -> dict[str, Any]:
    box: dict[str, Any] = {}
    ready = threading.Event()

    def started(info: dict[str, Any]) -> None:
        box["ok"] = info
        ready.set()

    def run() -> None:
        try:
            body(started)
        except BaseException as e:  # noqa: BLE001 - handed to the request if it is still waiting
            box.setdefault("error", e)
            ready.set()

    threading.Thread(target=run, name="apply-probation", daemon=True).start()
    ready.wait()
    if "ok" in box:
        return box["ok"]
    raise box["error"]
