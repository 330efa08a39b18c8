"""The control socket: line-delimited JSON over a Unix stream socket that only root can open.

Request  `{"op": "status", "args": {"json": true}}`  (one line)
Response `{"ok": true, "result": {...}}`  or  `{"ok": false, "error": "...", "exit_code": 2, "kind": "BadInput"}`

Root-only twice over: the socket lives in a 0700 root directory with mode 0600, and every
connection's SO_PEERCRED uid is checked, so a loosened mode or a passed file descriptor still
gets nothing. One thread per connection; the daemon's handler serialises writes.

Starvation: a connection has IDLE_TIMEOUT_S to send each complete request line (a half-open or
trickling client is dropped), and RESERVED slots past MAX_CLIENTS take root's PRIORITY_OPS
(status, rollback, ...) only, with a shorter deadline. A request nested deeper than MAX_DEPTH
is refused; nothing a client sends can end a handler thread with a traceback.
"""
from __future__ import annotations

import json
import os
import socket
import struct
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tuner import redact
from tuner.daemon import logs
from tuner.errors import BadInput, MetaltuneError

SOCKET_NAME = "control.sock"
MAX_LINE = 1 << 20  # a request larger than 1 MiB is refused
MAX_CLIENTS = 32
RESERVED = 4  # slots past MAX_CLIENTS, for root's PRIORITY_OPS only
PRIORITY_OPS = frozenset({"status", "rollback", "recover", "confirm", "daemon", "search_stop"})
IDLE_TIMEOUT_S = 10.0  # to send one complete request line (and to take our answer)
RESERVED_TIMEOUT_S = 1.0  # a priority client sends its line right after connecting
MAX_DEPTH = 32  # nesting of a request's JSON
BUSY = "daemon busy: too many clients"


class Request(BaseModel):
    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)
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
        self._reserved = threading.BoundedSemaphore(RESERVED)
        self._answering = 0  # requests read and not yet answered
        self._answered = threading.Condition()

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        from safety.securefs import UnsafePath, secure_dir

        try:
            secure_dir(self.run_dir)  # ours, 0700, on a path no other user can change
        except UnsafePath as e:
            raise MetaltuneError(str(e)) from None
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
        s.listen(socket.SOMAXCONN)  # a burst of clients queues; it is not refused
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

    def drain(self, timeout: float) -> bool:
        """Wait until every request being handled has been answered (at shutdown: a client
        whose apply was just rolled back gets that answer before the process exits)."""
        with self._answered:
            return self._answered.wait_for(lambda: self._answering == 0, timeout=timeout)

    # -- connections -------------------------------------------------------------------------
    def _accept_loop(self) -> None:
        assert self._sock is not None
        sock = self._sock
        while not self._stopping.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:
                break
            if self._slots.acquire(blocking=False):
                slot = self._slots
            elif self._reserved.acquire(blocking=False):
                slot = self._reserved
            else:
                _busy(conn)
                continue
            threading.Thread(target=self._serve, args=(conn, slot), name="control-client",
                             daemon=True).start()

    def _serve(self, conn: socket.socket, slot: threading.BoundedSemaphore) -> None:
        reserved = slot is self._reserved
        try:
            with conn:
                peer = peer_credentials(conn)
                if peer.uid not in self.allowed_uids:
                    logs.log("control.refused", level="warning", uid=peer.uid, pid=peer.pid,
                             reason="not root")
                    _send(conn, {"ok": False, "exit_code": 1, "kind": "PermissionDenied",
                                 "error": f"permission denied: the control socket is root-only (uid {peer.uid})"})
                    return
                if reserved and peer.uid != 0:
                    _busy(conn)
                    return
                reader = _LineReader(conn)
                while True:
                    try:
                        line = reader.readline(RESERVED_TIMEOUT_S if reserved else IDLE_TIMEOUT_S)
                    except TimeoutError:
                        if reader.pending:
                            _send(conn, error_response(BadInput(
                                "request: no complete line within "
                                f"{RESERVED_TIMEOUT_S if reserved else IDLE_TIMEOUT_S:g} s")))
                        logs.log("control.idle", level="debug", pid=peer.pid)
                        return
                    if line is None:
                        return
                    if len(line) > MAX_LINE:
                        _send(conn, error_response(BadInput("request: longer than 1 MiB")))
                        return
                    if not line.strip():
                        continue
                    conn.settimeout(IDLE_TIMEOUT_S)  # for our answer: a client that never reads
                    with self._answered:
                        self._answering += 1
                    try:
                        _send(conn, self._answer(line, peer, reserved))
                    finally:
                        with self._answered:
                            self._answering -= 1
                            self._answered.notify_all()
                    if reserved:
                        return  # a reserved slot serves one request
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            pass
        except Exception as e:  # never a traceback out of a handler thread
            logs.log("control.error", level="error", error=f"{type(e).__name__}: {e}")
        finally:
            slot.release()

    def _answer(self, line: bytes, peer: Peer, reserved: bool) -> dict[str, Any]:
        try:
            req = _parse(line)
        except BadInput as e:
            return error_response(e)
        if reserved and req.op not in PRIORITY_OPS:
            return {"ok": False, "error": BUSY, "exit_code": 1, "kind": "OperationFailed"}
        try:
            result = self.handler(req.op, req.args, peer)
            return {"ok": True, "result": result}
        except RecursionError:
            return error_response(BadInput(f"request: nested deeper than {MAX_DEPTH} levels"))
        except Exception as e:  # every failure becomes an answer; the daemon keeps serving
            if not isinstance(e, (MetaltuneError, ValidationError)):
                logs.log("control.error", level="error", op=req.op, error=f"{type(e).__name__}: {e}")
            return error_response(e)

    def _dispatch(self, line: bytes, peer: Peer) -> dict[str, Any]:
        return self._answer(line, peer, reserved=False)


class _LineReader:
    """Lines from a socket with a deadline per line (not per recv: a client trickling one byte
    at a time does not hold its slot)."""

    def __init__(self, conn: socket.socket):
        self.conn = conn
        self.buf = bytearray()

    @property
    def pending(self) -> bool:
        return bool(self.buf)

    def readline(self, timeout: float) -> bytes | None:
        deadline = time.monotonic() + timeout
        while True:
            i = self.buf.find(b"\n")
            if i >= 0:
                line = bytes(self.buf[:i + 1])
                del self.buf[:i + 1]
                return line
            if len(self.buf) > MAX_LINE:
                return bytes(self.buf)
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            self.conn.settimeout(left)
            chunk = self.conn.recv(1 << 16)
            if not chunk:
                line, self.buf = bytes(self.buf), bytearray()
                return line or None
            self.buf += chunk


def _depth_ok(obj: Any, limit: int) -> bool:
    stack = [(obj, 1)]
    while stack:
        o, d = stack.pop()
        if isinstance(o, (dict, list)):
            if d > limit:
                return False
            stack.extend((v, d + 1) for v in (o.values() if isinstance(o, dict) else o))
    return True


def _parse(line: bytes) -> Request:
    try:
        data = json.loads(line)
    except RecursionError:
        raise BadInput(f"request: nested deeper than {MAX_DEPTH} levels") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BadInput(f"request: not JSON ({e.msg if hasattr(e, 'msg') else e})") from None
    if not _depth_ok(data, MAX_DEPTH):
        raise BadInput(f"request: nested deeper than {MAX_DEPTH} levels")
    try:
        return Request.model_validate(data)
    except ValidationError as e:
        from tuner.validation import first_error

        raise BadInput(f"request: {first_error(e, top='request', more=False)}") from None


def _busy(conn: socket.socket) -> None:
    try:
        conn.settimeout(1.0)
        _send(conn, {"ok": False, "error": BUSY, "exit_code": 1, "kind": "OperationFailed"})
    except OSError:
        pass
    finally:
        conn.close()


def _send(conn: socket.socket, obj: dict[str, Any]) -> None:
    if not obj.get("ok"):  # an error message may quote a URL with credentials
        obj = {**obj, "error": redact.text(str(obj.get("error", "")))}
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
