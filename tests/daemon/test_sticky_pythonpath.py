"""A PYTHONPATH entry in or under a sticky directory anyone can write (/tmp) never reaches a child
the daemon starts as root (issue 42, item 5): `nobody` wrote a `sitecustomize.py` into such a
directory on the daemon's PYTHONPATH and it ran as uid 0 in the `kernel_check` child, because
`check_path` lets sticky directories pass (right for a state dir, wrong for a module path,
which is searched by name)."""
from __future__ import annotations

import os
import pwd
import subprocess
import tempfile
from pathlib import Path

import pytest

import tests.daemon.conftest as dconf
from safety import pychild
from tests.daemon.conftest import write_config

RED = Path(__file__).resolve().parents[1] / "kernelsearch" / "redteam"
PLANTED = ("import os\nopen(os.path.join(os.path.dirname(__file__), 'ran-%d' % os.getpid()), 'w')"
           ".write('uid=%d' % os.geteuid())\n")


def as_nobody(fn) -> None:
    """Run `fn` in a forked child that became uid/gid nobody (the tests run as root)."""
    pw = pwd.getpwnam("nobody")
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setgroups([])
            os.setgid(pw.pw_gid)
            os.setuid(pw.pw_uid)
            fn()
            code = 0
        finally:
            os._exit(code)
    assert os.waitpid(pid, 0)[1] == 0, "the write as nobody failed"


@pytest.fixture
def sticky():
    """A directory like /tmp: root's, mode 1777, where nobody can reach it."""
    d = Path(tempfile.mkdtemp(prefix="h42-sticky-", dir="/tmp"))
    os.chmod(d, 0o1777)
    yield d
    subprocess.run(["rm", "-rf", str(d)])


def test_entries_in_or_under_a_sticky_dir_are_left_off_a_root_childs_path(sticky, caplog):
    owned = sticky / "roots"  # root's own 0755 dir inside /tmp: nobody can add to it
    owned.mkdir(mode=0o755)
    theirs = sticky / "theirs"
    as_nobody(lambda: theirs.mkdir(mode=0o755))
    missing = sticky / "not-yet"  # whoever creates it first owns it
    env = pychild.env({"PYTHONPATH": os.pathsep.join(map(str, (sticky, owned, theirs, missing)))})
    assert env["PYTHONPATH"] == str(owned)
    said = caplog.text
    assert f"{sticky}: writable by others (mode 1777)" in said
    assert f"{missing}: does not exist" in said and "owned by uid" in said


@pytest.mark.skipif(os.geteuid() != 0, reason="uid nobody is reached from root")
def test_a_sitecustomize_nobody_plants_in_a_sticky_pythonpath_dir_never_runs_as_root(
        tmp_path, sim_host, start_daemon, sticky, monkeypatch):
    real = dconf.base_env
    monkeypatch.setattr(dconf, "base_env", lambda run: {
        **real(run), "PYTHONPATH": os.pathsep.join((str(dconf.REPO), str(sticky)))})
    d = start_daemon(write_config(tmp_path / "daemon.toml", sim_host, tmp_path))
    d.wait_ready()
    # planted once the daemon runs (it imported its own site already): what its children import
    as_nobody(lambda: (sticky / "sitecustomize.py").write_text(PLANTED))
    r = d.call("kernel_check", timeout=300, family="softmax", device="cpu", no_timing=True,
               source=(RED / "honest.py").read_text())
    assert r["ok"], r
    ran = [p.read_text() for p in sticky.glob("ran-*")]
    assert ran == [], f"nobody's sitecustomize.py ran in the daemon's child: {ran}"
    assert f"PYTHONPATH entry {sticky} left off" in d.wait_log(f"PYTHONPATH entry {sticky}")
    assert d.stop() == 0
