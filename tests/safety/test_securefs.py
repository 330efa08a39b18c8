"""safety.securefs: which directories and files root trusts (StrictModes rules), on real
directories with real modes and owners."""
import os

import pytest

from safety.lock import WriterLock
from safety.securefs import UnsafePath, check_path, open_file, secure_dir


def test_creates_missing_components_and_enforces_the_mode(tmp_path):
    d = secure_dir(tmp_path / "a" / "b" / "state")
    assert d == (tmp_path / "a" / "b" / "state").resolve()
    assert oct((tmp_path / "a" / "b" / "state").stat().st_mode & 0o777) == "0o700"
    assert oct((tmp_path / "a").stat().st_mode & 0o777) == "0o755"
    (tmp_path / "a" / "b" / "state").chmod(0o755)
    secure_dir(tmp_path / "a" / "b" / "state")
    assert (tmp_path / "a" / "b" / "state").stat().st_mode & 0o777 == 0o700


def test_group_or_world_writable_without_sticky_is_refused(tmp_path):
    (tmp_path / "open").mkdir()
    (tmp_path / "open").chmod(0o777)
    with pytest.raises(UnsafePath, match="writable by group"):
        secure_dir(tmp_path / "open" / "state")
    (tmp_path / "open").chmod(0o1777)  # sticky, like /tmp: others cannot replace our entries
    assert secure_dir(tmp_path / "open" / "state").name == "state"


def test_our_own_symlinks_are_followed_a_file_on_the_path_is_not(tmp_path):
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "link")
    assert secure_dir(tmp_path / "link" / "s") == (tmp_path / "real" / "s").resolve()
    (tmp_path / "f").write_text("")
    with pytest.raises(UnsafePath, match="not a directory"):
        check_path(tmp_path / "f" / "s")


def test_lock_file_symlink_or_hard_link_is_refused(tmp_path):
    d = secure_dir(tmp_path / "state")
    target = tmp_path / "target"
    target.write_text("keep\n")
    os.symlink(target, d / "writer.lock")
    with pytest.raises(UnsafePath, match="symlink"):
        WriterLock(d).acquire()
    os.unlink(d / "writer.lock")
    os.link(target, d / "writer.lock")
    with pytest.raises(UnsafePath, match="hard links"):
        open_file(d / "writer.lock", os.O_RDWR | os.O_CREAT)
    assert target.read_text() == "keep\n"
    os.unlink(d / "writer.lock")
    with WriterLock(d):
        assert "pid" in (d / "writer.lock").read_text()
