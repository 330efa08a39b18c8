"""`install --exec` and `daemon --check` refuse an executable another user can change (issue 42,
item 6): owned by nobody, mode 0777, in a folder nobody owns, or a script whose `#!`
interpreter nobody owns; both took them, and the root service would have run whatever that user
put there. The rule is the project's own for code root loads (safety.securefs.check_file)."""
from __future__ import annotations

import os
import pwd
from pathlib import Path

import pytest

from tests.daemon.test_config_install import cli

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="files of uid nobody are made as root")
NOBODY = pwd.getpwnam("nobody").pw_uid


def script(p: Path, interp: str = "/bin/sh", mode: int = 0o755, uid: int = 0) -> Path:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(f"#!{interp}\nexec true\n")
    os.chown(p, uid, 0)
    p.chmod(mode)
    return p


def test_install_exec_refuses_what_another_user_can_change(tmp_path):
    root = tmp_path / "root"
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, NOBODY, 0)
    interp = script(tmp_path / "py/python3", uid=NOBODY)
    cases = [
        (script(tmp_path / "a/metaltune", uid=NOBODY), f"owned by uid {NOBODY}"),
        (script(tmp_path / "b/metaltune", mode=0o777), "writable by group (mode 0777)"),
        (script(theirs / "metaltune"), f"directory owned by uid {NOBODY}"),
        (script(tmp_path / "c/metaltune", interp=str(interp)),
         f"its interpreter {interp}: {interp}: owned by uid {NOBODY}"),
    ]
    for exe, why in cases:
        r = cli("install", "--root", str(root), "--exec", str(exe))
        assert r.returncode == 2 and r.stderr.count("\n") == 1, (exe, r.stdout, r.stderr)
        assert f"--exec: {exe}: " in r.stderr and why in r.stderr, (why, r.stderr)
        assert "Traceback" not in r.stderr and not root.exists()  # nothing written
    ok = script(tmp_path / "d/metaltune")
    assert cli("install", "--root", str(root), "--exec", str(ok)).returncode == 0


def test_daemon_check_says_not_ok_when_the_installed_exec_becomes_another_users(tmp_path):
    root = tmp_path / "root"
    exe = script(root / "opt/metaltune/bin/metaltune")
    r = cli("install", "--root", str(root), "--exec", "/opt/metaltune/bin/metaltune")
    assert r.returncode == 0, r.stderr
    assert cli("daemon", "--check", "--root", str(root)).returncode == 0
    exe.chmod(0o757)
    r = cli("daemon", "--check", "--root", str(root))
    assert r.returncode == 1 and r.stderr.count("\n") == 1, (r.stdout, r.stderr)
    assert "not ok" in r.stderr and "writable by others (mode 0757)" in r.stderr, r.stderr
    exe.chmod(0o755)
    interp = script(tmp_path / "nobodys/python3", uid=NOBODY)
    script(exe, interp=str(interp))
    r = cli("daemon", "--check", "--root", str(root))
    assert r.returncode == 1 and f"its interpreter {interp}" in r.stderr, r.stderr
