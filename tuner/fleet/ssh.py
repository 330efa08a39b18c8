"""SSH with paramiko, host keys verified.

By default a host must already be in known_hosts (paramiko's RejectPolicy): an unknown or changed
key refuses the connection. Trust on first use happens only when asked (`trust_new=True`); the new
key is then appended to the known_hosts file so that the next connection verifies it. Private key
material never reaches logs or error messages (only its path).
"""
from __future__ import annotations

import fcntl
import logging
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner.errors import OperationFailed

log = logging.getLogger("metaltune.fleet.ssh")
_known_hosts_lock = threading.Lock()
DEFAULT_KNOWN_HOSTS = Path("~/.ssh/known_hosts")
SYSTEM_KNOWN_HOSTS = Path("/etc/ssh/ssh_known_hosts")


class SSHError(OperationFailed):
    """Any failure to reach or use a host over SSH; `kind` is a stable code for reports."""

    kind = "ssh_error"


class HostUnreachable(SSHError):
    kind = "unreachable"


class HostKeyRejected(SSHError):
    kind = "host_key_rejected"


class AuthFailed(SSHError):
    kind = "auth_failed"


class CommandTimeout(SSHError):
    kind = "timeout"


@dataclass
class SSHTarget:
    host: str
    port: int = 22
    user: str = "root"
    key: Path | None = None
    known_hosts: Path | None = None
    trust_new: bool = False
    connect_timeout: float = 10.0

    @property
    def where(self) -> str:
        return f"{self.user}@{self.host}:{self.port}"

    def known_hosts_path(self) -> Path:
        return (self.known_hosts or DEFAULT_KNOWN_HOSTS).expanduser()


@dataclass
class Result:
    rc: int
    stdout: str
    stderr: str
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


def _fingerprint(key: Any) -> str:
    import base64
    import hashlib

    return "SHA256:" + base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")


def _policy(target: SSHTarget) -> Any:
    import paramiko

    if not target.trust_new:
        return paramiko.RejectPolicy()

    class TrustOnFirstUse(paramiko.MissingHostKeyPolicy):
        """Accept an unknown (never a changed) key and record it in known_hosts."""

        def missing_host_key(self, client: Any, hostname: str, key: Any) -> None:
            path = target.known_hosts_path()
            line = f"{hostname} {key.get_name()} {key.get_base64()}\n"
            with _known_hosts_lock:
                path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
                with open(path, "a") as f:
                    fcntl.flock(f, fcntl.LOCK_EX)
                    f.write(line)
            client.get_host_keys().add(hostname, key.get_name(), key)
            log.warning("trusted new host key for %s: %s %s (recorded in %s)",
                        hostname, key.get_name(), _fingerprint(key), path)

    return TrustOnFirstUse()


def connect(target: SSHTarget) -> Any:
    """An authenticated paramiko.SSHClient, or an SSHError saying exactly why not."""
    import paramiko

    client = paramiko.SSHClient()
    kh = target.known_hosts_path()
    if SYSTEM_KNOWN_HOSTS.is_file():  # the site-wide list, as OpenSSH reads it (never written)
        client.load_system_host_keys(str(SYSTEM_KNOWN_HOSTS))
    if kh.is_file():
        client.load_host_keys(str(kh))
    client.set_missing_host_key_policy(_policy(target))
    key = str(Path(target.key).expanduser()) if target.key else None
    try:
        client.connect(
            target.host, port=target.port, username=target.user, key_filename=key,
            look_for_keys=key is None, allow_agent=key is None, timeout=target.connect_timeout,
            banner_timeout=target.connect_timeout, auth_timeout=target.connect_timeout,
        )
    except paramiko.BadHostKeyException as e:
        client.close()
        raise HostKeyRejected(f"{target.where}: host key CHANGED (got {_fingerprint(e.key)}, "
                              f"known_hosts {kh} has another): refusing") from None
    except paramiko.AuthenticationException as e:
        client.close()
        raise AuthFailed(f"{target.where}: authentication failed ({type(e).__name__}"
                         f"{', key ' + key if key else ''})") from None
    except paramiko.SSHException as e:
        client.close()
        msg = str(e)
        if "not found in known_hosts" in msg:
            raise HostKeyRejected(f"{target.where}: host key not in {kh}; refusing (verify it and add "
                                  f"it, or pass --trust-new to trust on first use)") from None
        raise SSHError(f"{target.where}: ssh failed: {msg}") from None
    except (OSError, socket.timeout, EOFError) as e:
        client.close()
        raise HostUnreachable(f"{target.where}: unreachable ({type(e).__name__}: {e})") from None
    return client


def run(client: Any, command: str, timeout: float = 600.0, stdin: bytes | None = None,
        where: str = "") -> Result:
    """Run one command; read stdout and stderr as they come (so neither fills the window)."""
    t0 = time.monotonic()
    try:
        transport = client.get_transport()
        chan = transport.open_session(timeout=30)
        chan.exec_command(command)
        if stdin:
            chan.sendall(stdin)
        chan.shutdown_write()
    except Exception as e:
        raise HostUnreachable(f"{where}: session failed ({type(e).__name__}: {e})") from None
    out, err = bytearray(), bytearray()
    chan.settimeout(0.0)
    while True:
        busy = False
        while chan.recv_ready():
            out += chan.recv(65536)
            busy = True
        while chan.recv_stderr_ready():
            err += chan.recv_stderr(65536)
            busy = True
        if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
            break
        if time.monotonic() - t0 > timeout:
            chan.close()
            raise CommandTimeout(f"{where}: command timed out after {timeout:.0f}s")
        if not busy:
            time.sleep(0.01)
    rc = chan.recv_exit_status()
    chan.close()
    return Result(rc, out.decode(errors="replace"), err.decode(errors="replace"), time.monotonic() - t0)


def put_bytes(client: Any, data: bytes, remote_path: str, mode: int = 0o600) -> None:
    sftp = client.open_sftp()
    try:
        with sftp.open(remote_path, "wb") as f:
            f.write(data)
        sftp.chmod(remote_path, mode)
    finally:
        sftp.close()


class Session:
    """One host's connection, opened lazily, closed on exit."""

    def __init__(self, target: SSHTarget) -> None:
        self.target = target
        self._client: Any = None

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = connect(self.target)
        return self._client

    def run(self, command: str, timeout: float = 600.0, stdin: bytes | None = None) -> Result:
        return run(self.client, command, timeout, stdin, self.target.where)

    def put_bytes(self, data: bytes, remote_path: str) -> None:
        put_bytes(self.client, data, remote_path)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def env_prefix(env: dict[str, str]) -> str:
    """`env K=V ...` for a remote command (sshd's AcceptEnv usually drops client-sent vars)."""
    import shlex

    if not env:
        return ""
    return "env " + " ".join(shlex.quote(f"{k}={v}") for k, v in sorted(env.items())) + " "


