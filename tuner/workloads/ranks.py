"""Processes for a multi-GPU workload: one rank per GPU, each a fresh interpreter.

Ranks are started with subprocess (not multiprocessing's spawn, which re-imports the parent's
main module: the CLI's `python -m tuner` would run again in every rank), with an environment
built here (the host's, less any NCCL_* variable, plus the rank's settings: nothing is changed in
this process's own environment). Each rank connects back over a Unix socket in a private
directory and then answers requests: `Ranks.call(request)` sends one to every rank and returns
every reply, or raises (a rank's error, its death, or a timeout; the ranks are then stopped).

A rank runs `python -m tuner.workloads.ranks MODULE:FUNCTION`, reads its start message (rank,
world, rendezvous, spec) from the socket, and calls FUNCTION(start, serve) where `serve(handler)`
loops over requests until "stop".
"""
from __future__ import annotations

import importlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import weakref
from multiprocessing.connection import Connection
from typing import Any, Callable, Mapping, Optional

from safety import pychild
from tuner.workloads.collectives import MULTICAST_OFF


class RankError(RuntimeError):
    """A rank failed, died or gave no answer in time."""


class Ranks:
    def __init__(self, target: str, world: int, spec: Mapping[str, Any], env: Mapping[str, str],
                 start_timeout_s: float = 300.0, name: str = "metaltune-rank"):
        self.world, self.name = world, name
        self._dir = tempfile.mkdtemp(prefix="metaltune-ranks-")  # 0700: only we can connect
        address = os.path.join(self._dir, "sock")
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        srv.bind(address)
        srv.listen(world)
        # the settings say what runs, not whatever NCCL_* the host's shell exported
        child_env = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_")}
        child_env.update(env)
        child_env.update(MULTICAST_OFF)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.conns: list[Optional[Connection]] = [None] * world
        self._finalizer = weakref.finalize(self, Ranks._shutdown, self.conns, self.procs,
                                           self._dir)
        try:
            for r in range(world):
                self.procs.append(subprocess.Popen(
                    pychild.argv("tuner.workloads.ranks", target, address, str(r)),
                    env=pychild.env(child_env), stdin=subprocess.DEVNULL, start_new_session=True))
            deadline = time.monotonic() + start_timeout_s
            for _ in range(world):
                srv.settimeout(max(0.1, deadline - time.monotonic()))
                try:
                    sock, _ = srv.accept()
                except socket.timeout:
                    raise RankError(f"{name}: ranks did not connect in {start_timeout_s:.0f} s "
                                    f"(exit codes {[p.poll() for p in self.procs]})") from None
                sock.settimeout(None)
                conn = Connection(sock.detach())
                rank = conn.recv()
                self.conns[rank] = conn
        except BaseException:
            srv.close()
            self.close()
            raise
        srv.close()
        init = f"file://{self._dir}/rendezvous"
        for r, conn in enumerate(self.conns):
            assert conn is not None
            conn.send({"rank": r, "world": world, "init": init, "spec": dict(spec)})
        self.started = self._replies(start_timeout_s)

    def _replies(self, timeout_s: Optional[float]) -> list[Any]:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        out = []
        for r, conn in enumerate(self.conns):
            assert conn is not None
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                ready = conn.poll(left)
                status, value = conn.recv() if ready else (None, None)
            except (EOFError, OSError):
                code = self.procs[r].poll()
                self.close()
                raise RankError(f"{self.name} {r} died (exit code {code})") from None
            if not ready:
                self.close()
                raise RankError(f"{self.name} {r} gave no answer in {timeout_s:.0f} s")
            if status != "ok":
                self.close()
                raise RankError(f"{self.name} {r}: {value}")
            out.append(value)
        return out

    def call(self, request: Any, timeout_s: Optional[float] = None) -> list[Any]:
        for conn in self.conns:
            assert conn is not None
            conn.send(request)
        return self._replies(timeout_s)

    @staticmethod
    def _shutdown(conns: list[Optional[Connection]], procs: list[subprocess.Popen[bytes]],
                  tmpdir: str) -> None:
        for conn in conns:
            if conn is not None:
                try:
                    conn.send(("stop",))
                    conn.close()
                except (OSError, ValueError):
                    pass
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                # a rank hung in a collective: its whole session (compile workers too)
                try:
                    os.killpg(p.pid, 9)
                except ProcessLookupError:
                    pass
                p.wait(timeout=10)
        shutil.rmtree(tmpdir, ignore_errors=True)

    def close(self) -> None:
        self._finalizer()


def serve(conn: Connection, handler: Callable[[Any], Any]) -> None:
    """A rank's request loop: handler(request) -> reply, until ("stop",) or the parent is gone."""
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg == ("stop",):
            return
        try:
            conn.send(("ok", handler(msg)))
        except Exception as e:  # noqa: BLE001 (reported to the parent, which decides)
            conn.send(("error", f"{type(e).__name__}: {e}"))


def _main(argv: list[str]) -> int:
    target, address, rank = argv[0], argv[1], int(argv[2])
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(address)
    conn = Connection(sock.detach())
    conn.send(rank)
    start = conn.recv()
    os.environ.update(MULTICAST_OFF)  # whatever the environment said
    mod, fn = target.split(":")
    try:
        run: Callable[..., Any] = getattr(importlib.import_module(mod), fn)
        handler = run(start)
    except BaseException as e:  # noqa: BLE001 (the parent reports it)
        conn.send(("error", f"{type(e).__name__}: {e}"))
        return 1
    conn.send(("ok", {"rank": rank, "pid": os.getpid()}))
    try:
        serve(conn, handler)
    finally:
        close = getattr(handler, "close", None)
        if close is not None:
            close()
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
