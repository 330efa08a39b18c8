"""Small helpers for knobs backed by sysfs/procfs/etc files under a Host's root.

Writability is judged from the mode bits, as sysfs itself reports it (read-only attributes are
0444; a VM's or a simulated VM's masked files too), not from os.access, which is always true for
root on a writable mount.
"""
from __future__ import annotations

import os
from pathlib import Path

from tuner.errors import KnobUnavailable, OperationFailed


def read_text(p: Path) -> str:
    try:
        return p.read_text().strip()
    except OSError as e:
        raise KnobUnavailable(f"cannot read {p}: {e.strerror or e}") from None


def writable(p: Path) -> bool:
    try:
        st = p.stat()
    except OSError:
        return False
    return bool(st.st_mode & 0o222) and os.access(p, os.W_OK)


def write_text(p: Path, value: str) -> None:
    """One write(2) of the whole value, as `echo value > file` does (sysfs wants that)."""
    if not writable(p):
        raise KnobUnavailable(f"{p} is read-only here")
    try:
        fd = os.open(p, os.O_WRONLY | os.O_TRUNC)  # what `echo v > file` does; sysfs ignores TRUNC
        try:
            os.write(fd, (value + "\n").encode())
        finally:
            os.close(fd)
    except OSError as e:
        raise OperationFailed(f"writing {value!r} to {p} failed: {e.strerror or e}") from None


def atomic_write(p: Path, text: str, mode: int = 0o644) -> None:
    """Replace a config file atomically (temp file, fsync, rename) so a crash leaves old or new."""
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.tmp{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.chmod(tmp, mode)
    os.replace(tmp, p)
    dfd = os.open(p.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def bracketed(text: str) -> tuple[str | None, list[str]]:
    """`always [madvise] never` → ("madvise", ["always", "madvise", "never"])."""
    cur, opts = None, []
    for tok in text.split():
        if tok.startswith("[") and tok.endswith("]"):
            tok = tok[1:-1]
            cur = tok
        opts.append(tok)
    return cur, opts
