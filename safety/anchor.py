"""The journal's anchor: a small second file beside the journal (`journal.anchor` next to
`journal.db`) that says which journal this is and what it had in force, so that a journal which
is not the one metaltune wrote is never taken for a clean one.

SQLite detects a torn page, not a missing file: a journal truncated to 0 bytes, deleted, replaced
by an older copy or by another host's journal opens as an empty or a different, valid database,
"nothing to recover", and the next apply would record the tuned value in force as the new
baseline. The anchor holds the journal's id (a random epoch written into the journal's `meta`
table when it is created), the last transaction id, the baseline and the knobs whose value may
differ from it; `Journal` compares the two on every open.

Written after the journal's commit (so it is never ahead of it) and before the knob is touched,
whole (temp file, fsync, rename, fsync of the folder) under an flock on the state folder, so
concurrent writers (the caller, its watchdog, the daemon) leave the newest state.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
from pathlib import Path
from typing import Any, Iterator, Optional

from safety.errors import JournalDamaged

FORMAT = 1


def path_for(journal_path: str | os.PathLike[str]) -> Path:
    p = Path(journal_path)
    return p.with_name(p.stem + ".anchor")


def read(path: Path) -> Optional[dict[str, Any]]:
    """The anchor, None when there is none; JournalDamaged when it is there but unreadable."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise JournalDamaged(f"{path}: cannot read the journal's anchor: {e.strerror}") from None
    try:
        data = json.loads(raw)
        if not isinstance(data, dict) or data.get("format") != FORMAT or \
                not isinstance(data.get("journal_id"), str) or not isinstance(data.get("last_txn"), int):
            raise ValueError("not an anchor record")
    except ValueError as e:
        raise JournalDamaged(f"{path}: the journal's anchor is damaged ({e}); if the journal "
                             f"itself is intact, remove {path.name} and it is rebuilt from the journal") from None
    return data


def read_quiet(path: Path) -> Optional[dict[str, Any]]:
    """The anchor, or None when it is missing or unreadable."""
    try:
        return read(path)
    except JournalDamaged:
        return None


@contextlib.contextmanager
def locked(folder: Path) -> Iterator[None]:
    """An flock on the folder itself (no extra file): one anchor writer at a time."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the flock


def write(path: Path, data: dict[str, Any]) -> None:
    """Replace the anchor whole and durably. An OSError (no space, read-only) propagates with
    the OS's reason: the caller must not go on to touch a knob the anchor does not cover."""
    body = json.dumps({"format": FORMAT, **data}, sort_keys=True, default=str).encode() + b"\n"
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)  # a leftover of a process with our pid that died mid-write
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(body)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    os.close(fd)
    try:
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dfd)
    except OSError as e:  # some filesystems refuse fsync on a directory; the rename is done
        if e.errno not in (errno.EINVAL, errno.ENOTSUP):
            raise
    finally:
        os.close(dfd)
