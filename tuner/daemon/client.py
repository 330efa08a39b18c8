"""The CLI's side of the control socket. `try_call` answers None when no daemon is running, so
`tuner.cli.common.invoke` falls back to running the operation in-process."""
from __future__ import annotations

import errno
import json
import os
import socket
from pathlib import Path
from typing import Any

from tuner import errors
from tuner.errors import MetaltuneError, OperationFailed

#: set inside the daemon (and inherited by its children) so operations never call back into it
NO_DAEMON_ENV = "METALTUNE_NO_DAEMON"


def run_dir() -> Path:
    return Path(os.environ.get("METALTUNE_RUN_DIR", "/run/metaltune"))


def socket_path() -> Path:
    from tuner.daemon.server import SOCKET_NAME

    return run_dir() / SOCKET_NAME


def try_call(name: str, args: dict[str, Any], timeout: float | None = None) -> dict[str, Any] | None:
    """Run operation `name` in the daemon. None: no daemon (no socket, or a stale one)."""
    if os.environ.get(NO_DAEMON_ENV):
        return None
    path = socket_path()
    try:
        os.stat(path)
    except FileNotFoundError:
        return None
    except PermissionError:
        raise OperationFailed(f"{path}: the daemon's control socket is root-only; run as root") from None
    except NotADirectoryError:
        return None
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
            raise OperationFailed(f"{path}: cannot reach the daemon: {e.strerror}") from None
        s.settimeout(timeout)
        s.sendall((json.dumps({"op": name, "args": args}, default=str) + "\n").encode())
        f = s.makefile("rb")
        line = f.readline()
    finally:
        s.close()
    if not line:
        raise OperationFailed(f"{path}: the daemon closed the connection without answering {name!r}")
    resp = json.loads(line)
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
