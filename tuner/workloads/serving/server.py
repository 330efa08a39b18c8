"""The engine server as its user starts it (`<engine python> -m vllm.entrypoints.openai.api_server
--model DIR --host 127.0.0.1 --port P flags...`), a child in a process group of its own that dies
with its parent (PR_SET_PDEATHSIG), ready when `/health` answers 200 within the start timeout.
Stopping it stops the whole group (SIGTERM, then SIGKILL) and checks that no process of it and
no listener on its port is left. Its output goes to a log file whose end a failure carries."""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Mapping, Optional, Sequence

from kernelsearch.harness.confine import die_with_parent
from tuner.errors import WorkloadFailed

TAIL = 2000
_PREFIX = re.compile(r"^\(\w+ pid=\d+\) (ERROR|WARNING|INFO) [^\]]*\] ")  # vLLM's per-process prefix
_ERROR = re.compile(r"^[\w.]*(Error|Exception): ")


class EngineFailed(WorkloadFailed):
    """The engine did not start, crashed or timed out: a rejected trial with a stable `code`."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_free(port: int) -> bool:
    """No socket listens on `port` (connections in TIME_WAIT, which outlive every process, do
    not count: SO_REUSEADDR binds past them, never past a listener)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def healthy(url: str, timeout_s: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout_s) as r:  # noqa: S310 - loopback/config URL
            return r.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def engine_env(extra: Mapping[str, str]) -> dict[str, str]:
    """The engine's environment: ours without our module path (the engine has its own
    environment; metaltune's PYTHONPATH would shadow what is installed there), plus `extra`."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return {**env, **extra}


class EngineServer:
    """One server process group: `start()` (EngineFailed when it does not get ready), `stop()`."""

    def __init__(self, python: str, model: str, flags: Sequence[str], env: Mapping[str, str],
                 start_timeout_s: float = 300.0, log_dir: Optional[str] = None, grace_s: float = 15.0):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
                     "--host", "127.0.0.1", "--port", str(self.port), *flags]
        self.env = engine_env(env)
        self.start_timeout_s = start_timeout_s
        self.grace_s = grace_s  # SIGTERM to SIGKILL
        fd, self.log_path = tempfile.mkstemp(prefix="metaltune-engine-", suffix=".log", dir=log_dir)
        os.close(fd)
        self.proc: Optional[subprocess.Popen[bytes]] = None
        self.ready_s: Optional[float] = None

    def tail(self) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(max(0, os.path.getsize(self.log_path) - TAIL))
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def cause(self) -> str:
        """The last error line of the log that is not vLLM's generic "see root cause above" (the
        root cause: logged errors it survived come earlier), "" when none; for the message only."""
        found = ""
        try:
            with open(self.log_path, errors="replace") as f:
                for line in f:
                    text = _PREFIX.sub("", line.strip())
                    if (_ERROR.match(text) or ": error: " in text) and "root cause above" not in text:
                        found = text[:500]
        except OSError:
            pass
        return found

    def start(self) -> "EngineServer":
        parent = os.getpid()

        def preexec() -> None:  # own group (stopped whole), killed with us
            os.setsid()
            die_with_parent(parent)

        t0 = time.monotonic()
        with open(self.log_path, "wb") as log:
            # O_NOFOLLOW-free: mkstemp made the file ours with mode 0600, never a symlink
            try:
                self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, env=self.env,
                                             preexec_fn=preexec)
            except OSError as e:
                raise EngineFailed("engine_start_failed", f"cannot start {self.argv[0]}: {e}") from None
        while True:
            if self.proc.poll() is not None:
                code = self.proc.returncode
                self.stop()
                raise EngineFailed("engine_start_failed",
                                   f"engine exited {code} before it was ready: {self.cause()}; "
                                   f"log ends: {self.tail()!r}")
            if healthy(self.url):
                self.ready_s = time.monotonic() - t0
                return self
            if time.monotonic() - t0 > self.start_timeout_s:
                tail = self.tail()
                self.stop()
                raise EngineFailed("engine_timeout", f"engine not ready in {self.start_timeout_s:g}s; "
                                   f"log ends: {tail!r}")
            time.sleep(0.5)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def check_alive(self) -> None:
        """EngineFailed("engine_crashed") when the server died under a measurement."""
        if not self.alive():
            code = self.proc.returncode if self.proc else None
            self.stop()
            raise EngineFailed("engine_crashed", f"engine exited {code} while measured; log ends: "
                               f"{self.tail()!r}")

    def stop(self, grace_s: Optional[float] = None) -> None:
        """SIGTERM to the whole group, SIGKILL after `grace_s` (default: the server's); then the group must be gone and
        the port free (OperationFailed-style WorkloadFailed otherwise: a leak is never silent)."""
        if self.proc is None:
            return
        pgid = self.proc.pid
        for sig, wait in ((signal.SIGTERM, self.grace_s if grace_s is None else grace_s),
                          (signal.SIGKILL, 5.0)):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline and _group_alive(pgid):
                try:
                    self.proc.wait(timeout=0.2)
                except subprocess.TimeoutExpired:
                    pass
            if not _group_alive(pgid):
                break
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        deadline = time.monotonic() + 10
        while not port_free(self.port) and time.monotonic() < deadline:
            time.sleep(0.2)  # a killed listener's socket closes with its last process
        left = _group_alive(pgid)
        self.proc = None
        if left or not port_free(self.port):
            raise WorkloadFailed(f"engine server group {pgid} left "
                                 f"{'a process' if left else 'a listener on port %d' % self.port}")

    def close(self) -> None:
        try:
            self.stop()
        finally:
            try:
                os.unlink(self.log_path)
            except OSError:
                pass


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # zombies of our own child count as gone once reaped; others are still there
    import psutil

    return any(p.status() != psutil.STATUS_ZOMBIE for p in _members(pgid))


def _members(pgid: int) -> list:
    import psutil

    out = []
    for p in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(p.pid) == pgid:
                out.append(p)
        except (ProcessLookupError, psutil.Error, OSError):
            pass
    return out
