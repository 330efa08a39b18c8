"""The CLI's side of the control socket. `try_call` answers None when no daemon is running, so
`tuner.cli.common.invoke` falls back to running the operation in-process.

What answers on the socket path is believed only if it is the daemon: the run dir is a trusted
path (`safety.securefs`: no directory another user can write, no symlink another user made),
the socket file is root's (or ours), and the server's SO_PEERCRED uid is root (or ours). A busy
daemon (every slot taken) is retried for a few seconds: nothing was done on a refused connection.
"""
from __future__ import annotations

import errno
import json
import os
import socket
import stat
import struct
import time
from pathlib import Path
from typing import Any

from tuner import errors
from tuner.errors import MetaltuneError, OperationFailed
from tuner.ops.settings import NO_DAEMON_ENV
BUSY_RETRY_S = 10.0


def run_dir() -> Path:
    return Path(os.environ.get("METALTUNE_RUN_DIR", "/run/metaltune"))


def socket_path() -> Path:
    from tuner.daemon.server import SOCKET_NAME

    return run_dir() / SOCKET_NAME


def _trusted_uids() -> set[int]:
    return {0, os.geteuid()}


def _check_socket_file(path: Path) -> bool:
    """False: nothing there (no daemon). Raises OperationFailed when what is there, or the path
    to it, is not the daemon's."""
    from safety.securefs import UnsafePath, check_path

    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except PermissionError:
        raise OperationFailed(f"{path}: the daemon's control socket is root-only; run as root") from None
    try:
        check_path(path.parent)
    except UnsafePath as e:
        raise OperationFailed(f"{path}: not trusting the control socket: {e}") from None
    if not stat.S_ISSOCK(st.st_mode):
        raise OperationFailed(f"{path}: not a socket (a {'symlink' if stat.S_ISLNK(st.st_mode) else 'file'}); "
                              "not trusting it")
    if st.st_uid not in _trusted_uids():
        raise OperationFailed(f"{path}: socket owned by uid {st.st_uid}, not root; not trusting it")
    return True


def _server_uid(s: socket.socket) -> int:
    raw = s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", raw)[1]


def _once(path: Path, name: str, line: bytes, timeout: float | None) -> dict[str, Any] | None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        s.settimeout(5.0)
        try:
            s.connect(str(path))
        except (FileNotFoundError, ConnectionRefusedError):
            return None  # a daemon that died left its socket: work directly
        except PermissionError:
            raise OperationFailed(f"{path}: the daemon's control socket is root-only; run as root") from None
        except OSError as e:
            if e.errno in (errno.ECONNREFUSED, errno.ENOENT):
                return None
            if e.errno == errno.EAGAIN:  # the listen queue is full: as good as busy
                from tuner.daemon.server import BUSY

                return {"ok": False, "error": BUSY}
            raise OperationFailed(f"{path}: cannot reach the daemon: {e.strerror}") from None
        uid = _server_uid(s)
        if uid not in _trusted_uids():  # before a byte of its answer is believed
            raise OperationFailed(f"{path}: answered by a process of uid {uid}, not root; "
                                  "not trusting it")
        s.settimeout(timeout)
        try:
            s.sendall(line)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused (busy) before our request was read: the answer is still there
        f = s.makefile("rb")
        resp_line = f.readline()
    finally:
        s.close()
    if not resp_line:
        raise OperationFailed(f"{path}: the daemon closed the connection without answering {name!r}")
    try:
        resp = json.loads(resp_line)
    except ValueError:
        raise OperationFailed(f"{path}: the daemon's answer to {name!r} is not JSON") from None
    if not isinstance(resp, dict):
        raise OperationFailed(f"{path}: the daemon's answer to {name!r} is not an object")
    return resp


def try_call(name: str, args: dict[str, Any], timeout: float | None = None) -> dict[str, Any] | None:
    """Run operation `name` in the daemon. None: no daemon (no socket, or a stale one)."""
    if os.environ.get(NO_DAEMON_ENV):
        return None
    from tuner.daemon.server import BUSY

    path = socket_path()
    if not _check_socket_file(path):
        return None
    line = (json.dumps({"op": name, "args": args}, default=str) + "\n").encode()
    end = time.monotonic() + BUSY_RETRY_S
    pause = 0.05
    while True:
        resp = _once(path, name, line, timeout)
        if resp is None:
            return None
        if resp.get("ok") or resp.get("error") != BUSY or time.monotonic() > end:
            break
        time.sleep(pause)
        pause = min(pause * 2, 1.0)
    if resp.get("ok"):
        return resp.get("result") or {}
    raise _error(resp)


def call(name: str, args: dict[str, Any] | None = None, timeout: float | None = None) -> dict[str, Any]:
    """Like try_call, but no daemon is an error (for `metaltune daemon` subcommands)."""
    res = try_call(name, args or {}, timeout=timeout)
    if res is None:
        raise OperationFailed(f"no metaltune daemon is running (no socket at {socket_path()})")
    return res


def _error(resp: dict[str, Any]) -> MetaltuneError:
    kind = resp.get("kind") or ""
    msg = resp.get("error") or "the daemon refused the request"
    cls = getattr(errors, kind, None)
    if isinstance(cls, type) and issubclass(cls, MetaltuneError):
        return cls(msg)
    e = OperationFailed(msg)
    e.exit_code = int(resp.get("exit_code") or 1)
    return e
