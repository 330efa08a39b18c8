"""What a boot loader adapter does to the host: files it writes and commands it runs, each one
listed so `--dry-run` shows the plan without touching anything. Commands run through
`Host.run` (a timeout; on a simulated host DIR/bin first, where `sim init` puts its `bootctl` and
`systemctl`); a failing command is an OperationFailed naming it."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

from tuner.errors import OperationFailed
from tuner.knobs._files import atomic_write


class Actions:
    def __init__(self, host: Any, dry_run: bool = False):
        self.host = host
        self.dry_run = dry_run
        self.done: list[dict[str, Any]] = []

    def run(self, argv: Sequence[str], timeout: float = 60.0) -> str:
        self.done.append({"run": list(argv)})
        if self.dry_run:
            return ""
        try:
            r = self.host.run(list(argv), timeout=timeout)
        except (OSError, TimeoutError) as e:
            raise OperationFailed(f"{argv[0]}: {e}") from None
        except Exception as e:  # subprocess.TimeoutExpired
            raise OperationFailed(f"{' '.join(argv)}: {e}") from None
        if r.returncode != 0:
            raise OperationFailed(f"`{' '.join(argv)}` failed ({r.returncode}): "
                                  f"{(r.stderr or r.stdout).strip()[:300]}")
        return r.stdout

    def write(self, path: Path, text: str) -> None:
        """Atomic, never through a symlink at the final component (atomic_write's rename)."""
        self.done.append({"write": str(path), "text": text})
        if self.dry_run:
            return
        if path.is_symlink():
            raise OperationFailed(f"{path}: a symlink; refusing to write through it")
        atomic_write(path, text)

    def rename(self, src: Path, dst: Path) -> None:
        self.done.append({"rename": [str(src), str(dst)]})
        if self.dry_run:
            return
        os.rename(src, dst)
        _fsync_dir(dst.parent)

    def remove(self, path: Path) -> None:
        self.done.append({"remove": str(path)})
        if self.dry_run:
            return
        try:
            os.unlink(path)
            _fsync_dir(path.parent)
        except FileNotFoundError:
            pass


def _fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
