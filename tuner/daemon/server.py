"""The control socket: line-delimited JSON over a Unix stream socket that only root can open.

Request  `{"op": "status", "args": {"json": true}}`  (one line)
Response `{"ok": true, "result": {...}}`  or  `{"ok": false, "error": "...", "exit_code": 2, "kind": "BadInput"}`

Root-only twice over: the socket lives in a 0700 root directory with mode 0600, and every
connection's SO_PEERCRED uid is checked, so a loosened mode or a passed file descriptor still
gets nothing. One thread per connection; the daemon's handler serialises writes.
"""
from __future__ import annotations

import json
import os
import socket
import struct
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tuner.daemon import logs
from tuner.errors import BadInput, MetaltuneError

SOCKET_NAME = "control.sock"
MAX_LINE = 1 << 20  # a request larger than 1 MiB is refused
MAX_CLIENTS = 32


class Request(BaseModel):
    model_config = ConfigDict(extra="forbid")
    op: str = Field(min_length=1, max_length=64)
    args: dict[str, Any] = Field(default_factory=dict)


@dataclass(frozen=True)
class Peer:
    pid: int
    uid: int
    gid: int


Handler = Callable[[str, dict[str, Any], Peer], dict[str, Any]]


def peer_credentials(conn: socket.socket) -> Peer:
    raw = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return Peer(*struct.unpack("3i", raw))


def error_response(e: BaseException) -> dict[str, Any]:
    if isinstance(e, MetaltuneError):
        return {"ok": False, "error": str(e), "exit_code": e.exit_code, "kind": type(e).__name__}
    if isinstance(e, ValidationError):
        return {"ok": False, "error": str(e), "exit_code": 2, "kind": "BadInput"}
    return {"ok": False, "error": f"{type(e).__name__}: {e}", "exit_code": 1, "kind": "OperationFailed"}


class ControlServer:
    def __init__(self, run_dir: Path, handler: Handler, allowed_uids: frozenset[int] = frozenset({0})):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / SOCKET_NAME
        self.handler = handler
        self.allowed_uids = allowed_uids
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._slots = threading.BoundedSemaphore(MAX_CLIENTS)

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(self.run_dir, 0o700)
        if self.path.exists() or self.path.is_symlink():
            if _alive(self.path):
                raise MetaltuneError(f"{self.path}: another metaltune daemon is already running")
            self.path.unlink()  # stale socket of a daemon that died
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        old = os.umask(0o177)  # the socket is born 0600: no window where others may connect
        try:
            s.bind(str(self.path))
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)
        if os.geteuid() == 0:
            os.chown(self.path, 0, 0)
        s.listen(16)
        self._sock = s
        self._thread = threading.Thread(target=self._accept_loop, name="control-accept", daemon=True)
        self._thread.start()
        logs.log("control.listening", socket=str(self.path))

    def stop(self) -> None:
        self._stopping.set()
        if self._sock is not None:
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._sock.close()
            self._sock = None
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
        if self._thread is not None:
            self._thread.join(timeout=2)

    # -- connections -------------------------------------------------------------------------
    def _accept_loop(self) -> None:
        assert self._sock is not None
        sock = self._sock
        while not self._stopping.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:
                break
            if not self._slots.acquire(blocking=False):
                _send(conn, {"ok": False, "error": "daemon busy: too many clients", "exit_code": 1,
                             "kind": "OperationFailed"})
                conn.close()
                continue
            threading.Thread(target=self._serve, args=(conn,), name="control-client", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            with conn:
                peer = peer_credentials(conn)
                if peer.uid not in self.allowed_uids:
                    logs.log("control.refused", level="warning", uid=peer.uid, pid=peer.pid,
                             reason="not root")
                    _send(conn, {"ok": False, "exit_code": 1, "kind": "PermissionDenied",
                                 "error": f"permission denied: the control socket is root-only (uid {peer.uid})"})
                    return
                f = conn.makefile("rb")
                while True:
                    line = f.readline(MAX_LINE + 1)
                    if not line:
                        return
                    if len(line) > MAX_LINE:
                        _send(conn, error_response(BadInput("request: longer than 1 MiB")))
                        return
                    if not line.strip():
                        continue
                    _send(conn, self._dispatch(line, peer))
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            self._slots.release()

    def _dispatch(self, line: bytes, peer: Peer) -> dict[str, Any]:
        try:
            data = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            return error_response(BadInput(f"request: not JSON ({e.msg if hasattr(e, 'msg') else e})"))
        try:
            req = Request.model_validate(data)
        except ValidationError as e:
            err = e.errors()[0]
            field = ".".join(str(p) for p in err["loc"]) or "request"
            return error_response(BadInput(f"request: field {field}: {err['msg']}"))
        try:
            result = self.handler(req.op, req.args, peer)
            return {"ok": True, "result": result}
        except Exception as e:  # every failure becomes an answer; the daemon keeps serving
            if not isinstance(e, (MetaltuneError, ValidationError)):
                logs.log("control.error", level="error", op=req.op, error=f"{type(e).__name__}: {e}")
            return error_response(e)


def _send(conn: socket.socket, obj: dict[str, Any]) -> None:
    conn.sendall((json.dumps(obj, default=str) + "\n").encode())


def _alive(path: Path) -> bool:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(1.0)
    try:
        s.connect(str(path))
        return True
    except OSError:
        return False
    finally:
        s.close()
