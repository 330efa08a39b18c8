"""One writer per host: an flock on `<state_dir>/writer.lock`.

flock (not fcntl record locks) because the lock belongs to the open file, not the process: the
watchdog child shares it, so after the caller is killed the lock stays held until the watchdog
has restored the knobs, and it disappears with the last process holding it (no stale lock after a
crash). Re-entrant inside one process: the daemon holds it for its life and its transactions and
recovery reuse it.
"""
from __future__ import annotations

import fcntl
import os
import threading
import time
from pathlib import Path
from typing import Optional

from safety.errors import Busy
from safety.securefs import UnsafePath, open_file, secure_dir

_held: dict[str, list[int]] = {}  # path -> [fd, refcount], this process only
_mu = threading.Lock()


class WriterLock:
    def __init__(self, state_dir: str | os.PathLike[str], role: str = "writer"):
        self.path = Path(state_dir) / "writer.lock"
        self.role = role
        self._mine = False

    @property
    def fd(self) -> Optional[int]:
        e = _held.get(str(self.path))
        return e[0] if e else None

    def holder(self) -> str:
        try:
            fd = open_file(self.path, os.O_RDONLY)
        except (OSError, UnsafePath):
            return "unknown"
        try:
            return os.read(fd, 200).decode(errors="replace").strip() or "unknown"
        finally:
            os.close(fd)

    def acquire(self, timeout: float = 0.0) -> "WriterLock":
        if self._mine:
            return self
        key = str(self.path)
        with _mu:
            if key in _held:
                _held[key][1] += 1
                self._mine = True
                return self
            secure_dir(self.path.parent)  # never through a symlink or another user's dir
            fd = open_file(self.path, os.O_RDWR | os.O_CREAT)
            try:  # anything raised (Busy, a Ctrl-C as flock() returns) closes fd: no flock kept
                end = time.monotonic() + timeout
                while True:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        if time.monotonic() >= end:
                            raise Busy(f"another metaltune writer holds {self.path} "
                                       f"({self.holder()}); one writer per host") from None
                        time.sleep(0.02)
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"pid {os.getpid()} {self.role}\n".encode(), 0)
                _held[key] = [fd, 1]
                self._mine = True
            except BaseException:
                if _held.get(key, [None])[0] == fd:
                    del _held[key]
                self._mine = False
                os.close(fd)
                raise
        return self

    def release(self) -> None:
        if not self._mine:
            return
        self._mine = False
        key = str(self.path)
        with _mu:
            e = _held.get(key)
            if not e:
                return
            e[1] -= 1
            if e[1] == 0:
                del _held[key]
                os.close(e[0])  # releases the flock unless a watchdog child still shares it

    def __enter__(self) -> "WriterLock":
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
