"""The probation watchdog: a separate process that rolls a transaction back at its deadline, or
at once when the caller dies, using the journal alone. A separate process because a hung caller
(a thread stuck in a C call holding the GIL, a deadlock) must not be able to stop it.

Two ways to start it:
- fork (default): the child already has the knob objects; it touches only a fresh journal
  connection and the knobs.
- spawn (`knob_factory="pkg.mod:func"` + JSON kwargs): a fresh interpreter that rebuilds the knobs
  by name; nothing is inherited but the lock and a pipe. `python -m safety.watchdog ...`.

The watchdog shares the caller's writer lock (flock on the same open file), so after the caller is
killed the lock stays held until the knobs are back.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import select
import signal
import sys
import threading
import time
from typing import Any, Callable, Mapping, Optional

from safety import _crash, pychild
from safety.journal import Journal
from safety.restore import rollback_txn

POLL_S = 0.05


def watch(journal: Journal, txn_id: int, knobs: Mapping[str, Any], *, pipe_fd: Optional[int],
          caller_pid: Optional[int], stop: Optional[threading.Event] = None) -> Optional[dict]:
    """Block until the transaction is resolved, the caller quits us, the caller dies or the
    deadline passes; roll back in the last two cases."""
    caller_dead = False
    reason = ""
    while True:
        if pipe_fd is not None:
            r, _, _ = select.select([pipe_fd], [], [], POLL_S)
            if r:
                data = os.read(pipe_fd, 64)
                if not data:
                    caller_dead, reason = True, f"caller (pid {caller_pid}) died before confirming"
                elif b"q" in data:
                    return None
        elif stop is not None:
            if stop.wait(POLL_S):
                return None
        if not caller_dead and caller_pid is not None and os.getppid() != caller_pid:
            caller_dead, reason = True, f"caller (pid {caller_pid}) died before confirming"
        t = journal.txn(txn_id)
        if t is None or t["state"] in ("confirmed", "rolled_back", "rollback_failed"):
            return None
        if caller_dead:
            break
        if t["state"] != "rolling_back" and t["deadline"] is not None and time.time() >= t["deadline"]:
            reason = (f"probation_expired: not confirmed within {t['probation_s']:g}s"
                      if t["state"] == "probation" else "apply did not finish before its deadline")
            break
    return rollback_txn(journal, knobs, txn_id, reason, steal=caller_dead)


def _quiet_child() -> None:
    os.setsid()  # a Ctrl-C to the caller's process group must not kill its watchdog
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    _crash.disable()
    dn = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(dn, fd)


def fork_watchdog(journal_path: str, txn_id: int, knobs: Mapping[str, Any]) -> tuple[int, int]:
    """Fork the watchdog; returns (pid, write end of its pipe)."""
    r, w = os.pipe()
    caller = os.getpid()
    pid = os.fork()
    if pid == 0:  # child
        code = 0
        try:
            os.close(w)
            _quiet_child()
            watch(Journal(journal_path, verify=False), txn_id, knobs, pipe_fd=r, caller_pid=caller)
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    os.close(r)
    return pid, w


def spawn_watchdog(journal_path: str, txn_id: int, factory: str, factory_args: dict[str, Any],
                   lock_fd: Optional[int], ready_timeout: float = 20.0):
    """Start `python -m safety.watchdog` and wait until it has built its knobs."""
    import subprocess

    r, w = os.pipe()
    rr, rw = os.pipe()  # readiness
    fds = [r, rw] + ([lock_fd] if lock_fd is not None else [])
    env = dict(os.environ)
    env.pop("METALTUNE_CRASH_AT", None)
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (repo, env.get("PYTHONPATH")) if p)
    p = subprocess.Popen(  # as root: nothing of the caller's working directory on its path
        pychild.argv("safety.watchdog", "--journal", str(journal_path), "--txn", str(txn_id),
                     "--caller", str(os.getpid()), "--fd", str(r), "--ready-fd", str(rw),
                     "--factory", factory, "--factory-args", json.dumps(factory_args)),
        pass_fds=fds, start_new_session=True, stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=pychild.env(env))
    os.close(r)
    os.close(rw)
    ok, _, _ = select.select([rr], [], [], ready_timeout)
    msg = os.read(rr, 4096) if ok else b""
    os.close(rr)
    if msg[:1] != b"r":
        p.kill()
        err = p.communicate(timeout=5)[1].decode(errors="replace").strip().splitlines()
        os.close(w)
        raise RuntimeError("watchdog did not start: " + (err[-1] if err else "timeout"))
    p.stderr.close()
    return p, w


def load_factory(spec: str) -> Callable[..., Mapping[str, Any]]:
    mod, _, fn = spec.partition(":")
    if not mod or not fn:
        raise ValueError(f"knob factory {spec!r}: expected 'package.module:function'")
    return getattr(importlib.import_module(mod), fn)


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m safety.watchdog")
    ap.add_argument("--journal", required=True)
    ap.add_argument("--txn", type=int, required=True)
    ap.add_argument("--caller", type=int, required=True)
    ap.add_argument("--fd", type=int, required=True)
    ap.add_argument("--ready-fd", type=int, required=True)
    ap.add_argument("--factory", required=True)
    ap.add_argument("--factory-args", default="{}")
    a = ap.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    knobs = load_factory(a.factory)(**json.loads(a.factory_args))
    journal = Journal(a.journal, verify=False)  # it only finishes the transaction it was started for
    os.write(a.ready_fd, b"r")
    os.close(a.ready_fd)
    dn = os.open(os.devnull, os.O_RDWR)
    os.dup2(dn, 2)
    watch(journal, a.txn, knobs, pipe_fd=a.fd, caller_pid=a.caller)
    return 0


if __name__ == "__main__":
    sys.exit(main())
