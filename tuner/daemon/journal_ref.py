"""The daemon's one Journal, reopened when the file under it is no longer the one it opened.

A reset (`recover --from-defaults` after journal.db was deleted or damaged) or a restore puts a
new file at the path; a handle kept on the old one would write every later incident into a
deleted inode (or fail on it) while the change in force, applied after the reset, is recorded
only in the new file. So each use compares the path's (device, inode) with the one opened, and a
JournalDamaged drops the handle so the next use opens the file again."""
from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any, Optional

from tuner.daemon import logs


def _identity(path: Path) -> Optional[tuple[int, int]]:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


class JournalRef:
    def __init__(self, state_dir: Path):
        self.path = Path(state_dir) / "journal.db"
        self._journal: Any = None
        self._identity: Optional[tuple[int, int]] = None
        self._mu = threading.Lock()

    def __call__(self) -> Any:
        """The journal at the path now (opening one runs the schema script, so it is kept
        while the file stays the same); JournalDamaged as safety.Journal raises it."""
        with self._mu:
            now = _identity(self.path)
            if self._journal is not None and now != self._identity:
                logs.log("journal.reopened", level="warning", path=str(self.path),
                         reason="the journal file was replaced or removed")
                self._drop()
            if self._journal is None:
                from safety import Journal

                self._journal = Journal(self.path)
                self._identity = _identity(self.path)
            return self._journal

    def damaged(self) -> None:
        """A use of the journal raised JournalDamaged: open it afresh next time."""
        with self._mu:
            self._drop()

    def close(self) -> None:
        with self._mu:
            self._drop()

    def _drop(self) -> None:
        if self._journal is not None:
            try:
                self._journal.close()
            except Exception:  # noqa: BLE001 - a handle on a deleted file: nothing to keep
                pass
        self._journal, self._identity = None, None
