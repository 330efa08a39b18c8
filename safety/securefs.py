"""Directories and files that root may trust (sshd's StrictModes, for the state and run dirs).

A path is trusted when every directory on it, from /, is owned by root or by us and is not
writable by group or others unless sticky (like /tmp), and every symlink on it is owned by root
or by us (a link another user planted is never followed). Missing components are created by us,
one at a time relative to their parent's descriptor, so nothing can be swapped in between the
check and the use; files inside are opened with O_NOFOLLOW and checked by fstat.
"""
from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Optional

from safety.errors import SafetyError

_MAX_LINKS = 40


class UnsafePath(SafetyError):
    """A directory or file on a path root would use is not one it can trust."""

    exit_code = 1


def _trusted_uids() -> set[int]:
    return {0, os.geteuid()}


def _why_untrusted_dir(st: os.stat_result) -> Optional[str]:
    if st.st_uid not in _trusted_uids():
        return f"owned by uid {st.st_uid}"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
        return f"writable by {'group' if st.st_mode & stat.S_IWGRP else 'others'} " \
               f"(mode {stat.S_IMODE(st.st_mode):04o}) without the sticky bit"
    return None


def check_path(path: str | os.PathLike[str]) -> tuple[Path, list[str]]:
    """Walk `path` from /: (the real path of its longest existing prefix, the components still
    missing below it). Raises UnsafePath naming the first component that cannot be trusted."""
    want = Path(os.path.abspath(path))
    parts = list(want.parts[1:])
    cur = Path("/")
    links = 0
    while parts:
        part = parts.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            cur = cur.parent
            continue
        nxt = cur / part
        try:
            st = os.lstat(nxt)
        except FileNotFoundError:
            return cur, [part] + parts
        except OSError as e:
            raise UnsafePath(f"{nxt}: {e.strerror}") from None
        if stat.S_ISLNK(st.st_mode):
            if st.st_uid not in _trusted_uids():
                raise UnsafePath(f"{nxt}: a symlink owned by uid {st.st_uid}; refusing to follow it")
            links += 1
            if links > _MAX_LINKS:
                raise UnsafePath(f"{want}: too many levels of symbolic links")
            target = Path(os.readlink(nxt))
            parts = list(target.parts[1:] if target.is_absolute() else target.parts) + parts
            if target.is_absolute():
                cur = Path("/")
            continue
        if not stat.S_ISDIR(st.st_mode):
            raise UnsafePath(f"{nxt}: not a directory")
        why = _why_untrusted_dir(st)
        if why:
            raise UnsafePath(f"{nxt}: directory {why}; refusing to use {want}")
        cur = nxt
    return cur, []


def secure_dir(path: str | os.PathLike[str], mode: int = 0o700) -> Path:
    """Make sure `path` is a trusted directory of ours with `mode` (created if missing, parents
    0755): the check above, then mkdir of each missing component relative to its parent's fd,
    then fchmod through an O_NOFOLLOW descriptor. Returns the real path."""
    real, missing = check_path(path)
    fd = os.open(real, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for i, part in enumerate(missing):
            last = i == len(missing) - 1
            try:
                os.mkdir(part, mode if last else 0o755, dir_fd=fd)
            except FileExistsError:
                pass  # made meanwhile: checked below like any other
            try:
                nfd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                              dir_fd=fd)
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise UnsafePath(f"{real / part}: not a directory (a symlink?)") from None
                raise
            os.close(fd)
            fd = nfd
            real = real / part
            why = _why_untrusted_dir(os.fstat(fd))
            if why:
                raise UnsafePath(f"{real}: directory {why}")
        st = os.fstat(fd)
        if st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) != mode:
            try:
                os.fchmod(fd, mode)
            except OSError as e:
                if e.errno != errno.EROFS:  # a read-only state dir still serves reads
                    raise
    finally:
        os.close(fd)
    return real


def open_file(path: str | os.PathLike[str], flags: int, mode: int = 0o600) -> int:
    """os.open for a file in a directory already made safe by `secure_dir`: never through a
    symlink (O_NOFOLLOW), only a regular file of ours with one link; O_CLOEXEC always."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY, mode)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UnsafePath(f"{path}: is a symlink; refusing to follow it") from None
        raise
    st = os.fstat(fd)
    why = None
    if not stat.S_ISREG(st.st_mode):
        why = "not a regular file"
    elif st.st_uid != os.geteuid():
        why = f"owned by uid {st.st_uid}"
    elif st.st_nlink != 1:
        why = f"has {st.st_nlink} hard links"
    if why:
        os.close(fd)
        raise UnsafePath(f"{path}: {why}; refusing to use it")
    return fd


def check_code_dir(path: str | os.PathLike[str]) -> Path:
    """A directory root may import code from (a PYTHONPATH entry): `check_path`, and then
    stricter than it, because a module path is searched by name: the directory must exist (one
    missing under a sticky dir such as /tmp is anyone's to create) and nobody but root or us may
    add a file to it, sticky bit or not (anyone can create `sitecustomize.py` in /tmp). A file
    entry (a zip) is held to `check_file`. Returns the real path; raises UnsafePath."""
    real, missing = check_path(path)
    if missing:
        raise UnsafePath(f"{path}: does not exist (whoever creates it first decides what it holds)")
    st = os.stat(real)
    if not stat.S_ISDIR(st.st_mode):
        return check_file(real)
    if st.st_uid not in _trusted_uids():
        raise UnsafePath(f"{real}: owned by uid {st.st_uid}")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafePath(f"{real}: writable by {'others' if st.st_mode & stat.S_IWOTH else 'group'}"
                         f" (mode {stat.S_IMODE(st.st_mode):04o}): anyone there can add a module")
    return real


def check_file(path: str | os.PathLike[str]) -> Path:
    """A file root may load code from (an extension, a module): every directory up to / as
    `check_path` wants it, and the file itself (through any link we trust) a regular file owned
    by root or by us that neither group nor others can write. Returns its real path; raises
    UnsafePath naming what is wrong."""
    p = Path(os.path.abspath(path))
    for _ in range(_MAX_LINKS):
        real, missing = check_path(p.parent)
        if missing:
            raise UnsafePath(f"{p}: no such file")
        p = real / p.name
        try:
            st = os.lstat(p)
        except OSError as e:
            raise UnsafePath(f"{p}: {e.strerror}") from None
        if st.st_uid not in _trusted_uids():
            raise UnsafePath(f"{p}: owned by uid {st.st_uid}, not root")
        if not stat.S_ISLNK(st.st_mode):
            break
        p = Path(os.path.join(p.parent, os.readlink(p)))
    else:
        raise UnsafePath(f"{path}: too many levels of symbolic links")
    if not stat.S_ISREG(st.st_mode):
        raise UnsafePath(f"{p}: not a regular file")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafePath(f"{p}: writable by {'group' if st.st_mode & stat.S_IWGRP else 'others'}"
                         f" (mode {stat.S_IMODE(st.st_mode):04o})")
    return p
