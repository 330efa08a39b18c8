"""sd_notify over NOTIFY_SOCKET (the protocol is one datagram of `KEY=VALUE` lines; a library is
not worth a dependency). Also the watchdog interval systemd asks for (WATCHDOG_USEC, half of it).

The socket address is taken from the environment once and the variables are removed, as
`sd_notify(unset_environment=1)` does, so search children never speak for the service.
"""
from __future__ import annotations

import os
import socket
from typing import Mapping, MutableMapping


class Notifier:
    def __init__(self, env: MutableMapping[str, str] | None = None):
        env = os.environ if env is None else env
        addr = env.pop("NOTIFY_SOCKET", None)
        usec = env.pop("WATCHDOG_USEC", None)
        pid = env.pop("WATCHDOG_PID", None)
        self.address: str | None = None
        if addr:
            # "@name" is an abstract-namespace socket
            self.address = "\0" + addr[1:] if addr.startswith("@") else addr
        self.watchdog_usec = _watchdog_usec(usec, pid)
        self._sock: socket.socket | None = None

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def watchdog_interval(self) -> float | None:
        """Seconds between WATCHDOG=1 pings: half of WatchdogSec, as sd_watchdog_enabled(3) advises."""
        return None if self.watchdog_usec is None else self.watchdog_usec / 2e6

    def send(self, fields: Mapping[str, object]) -> bool:
        if self.address is None:
            return False
        msg = "\n".join(f"{k}={_one_line(v)}" for k, v in fields.items()).encode()
        try:
            if self._sock is None:
                # non-blocking: a datagram socket whose reader stopped reading fills up, and a
                # blocked send would stall the main loop (and so the watchdog pings themselves)
                self._sock = socket.socket(socket.AF_UNIX,
                                           socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK)
            self._sock.sendto(msg, self.address)
            return True
        except OSError:
            return False  # systemd gone, socket missing or full: the daemon keeps working

    def ready(self, status: str) -> bool:
        return self.send({"READY": 1, "STATUS": status, "MAINPID": os.getpid()})

    def status(self, status: str) -> bool:
        return self.send({"STATUS": status})

    def watchdog(self) -> bool:
        return self.send({"WATCHDOG": 1})

    def reloading(self) -> bool:
        # systemd >= 253 wants MONOTONIC_USEC with RELOADING=1 (Type=notify-reload); harmless before
        import time

        return self.send({"RELOADING": 1, "MONOTONIC_USEC": int(time.monotonic() * 1e6)})

    def stopping(self, status: str = "stopping") -> bool:
        return self.send({"STOPPING": 1, "STATUS": status})

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def _one_line(v: object) -> str:
    return str(v).replace("\n", " ")


def _watchdog_usec(usec: str | None, pid: str | None) -> int | None:
    if not usec:
        return None
    if pid and pid.isdigit() and int(pid) != os.getpid():
        return None  # meant for another process
    try:
        n = int(usec)
    except ValueError:
        return None
    return n if n > 0 else None
