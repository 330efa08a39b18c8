"""The daemon's two locks: one daemon per run dir (an flock on run_dir/daemon.lock, released by
the kernel when the process dies) and the host's writer lock (safety's WriterLock), held for the
daemon's life and handed to a search child while one runs."""
from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import Any, Optional

from tuner.errors import OperationFailed


class DaemonLocks:
    def __init__(self, run_dir: Path, state_dir: Path):
        self.run_dir, self.state_dir = Path(run_dir), Path(state_dir)
        self.fd: Optional[int] = None  # the run dir's lock (closed in forked children)
        self._writer: Any = None

    @property
    def writing(self) -> bool:
        """Whether this process holds the host's writer lock now."""
        return self._writer is not None

    def lock_daemon(self) -> None:
        """One daemon per run dir, then the host's writer lock."""
        from safety.securefs import UnsafePath, open_file, secure_dir

        try:  # never through a symlink or a directory another user can write
            secure_dir(self.run_dir)
            fd = open_file(self.run_dir / "daemon.lock", os.O_RDWR | os.O_CREAT)
            secure_dir(self.state_dir)
        except UnsafePath as e:
            raise OperationFailed(str(e)) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise OperationFailed(f"another metaltune daemon is running ({self.run_dir}/daemon.lock)") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self.fd = fd
        self.take_writer(timeout=60.0)

    def take_writer(self, timeout: float) -> None:
        from safety import Busy, WriterLock
        from safety.securefs import UnsafePath

        try:
            self._writer = WriterLock(self.state_dir, role="daemon").acquire(timeout=timeout)
        except (Busy, UnsafePath) as e:
            raise OperationFailed(str(e)) from None

    def give_writer(self) -> None:
        if self._writer is not None:
            self._writer.release()
            self._writer = None

    def close(self) -> None:
        self.give_writer()
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
