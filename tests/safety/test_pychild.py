"""Children of this interpreter take no module from their working directory, and only the
PYTHONPATH entries root can trust (safety.pychild; issue 33, item 1: the daemon's search child
and the watchdog inherit the caller's working directory, which may be /tmp)."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from safety import pychild

PLANTED = "import os\nopen(os.environ['H33_MARK'], 'w').write('ran as uid %d' % os.geteuid())\n"


@pytest.fixture
def open_dir():
    """A directory anyone can write, as /tmp is to every user (no sticky bit here)."""
    d = Path(tempfile.mkdtemp(prefix="h33-cwd-", dir="/tmp"))
    os.chmod(d, 0o777)
    yield d
    subprocess.run(["rm", "-rf", str(d)])


def test_the_daemons_search_child_imports_nothing_from_its_working_directory(
        tmp_path, open_dir, monkeypatch):
    from tuner.daemon.searches import SearchChild

    (open_dir / "json.py").write_text(PLANTED)  # the child's first import
    mark = tmp_path / "mark"
    monkeypatch.setenv("H33_MARK", str(mark))
    monkeypatch.setenv("METALTUNE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.chdir(open_dir)
    child = SearchChild("no_such_op", {}, "test", tmp_path)
    child.wait()
    assert not mark.exists(), mark.read_text()
    assert child.result() is not None, (tmp_path / "search-child.out").read_text()[-1000:]


def test_pythonpath_entries_others_can_write_are_left_off(tmp_path, open_dir):
    ok = tmp_path / "lib"
    ok.mkdir()
    env = pychild.env({"PYTHONPATH": os.pathsep.join([str(open_dir), str(ok), "rel/dir", ""]),
                       "PYTHONPYCACHEPREFIX": str(open_dir), "OTHER": "1"})
    assert env["PYTHONPATH"] == str(ok) and "PYTHONPYCACHEPREFIX" not in env
    assert env["OTHER"] == "1"
    assert "PYTHONPATH" not in pychild.env({"PYTHONPATH": str(open_dir)})


def test_a_child_run_from_a_writable_directory_never_imports_from_it(tmp_path, open_dir):
    (open_dir / "secrets.py").write_text(PLANTED)
    mark = tmp_path / "mark"
    r = subprocess.run(pychild.argv("secrets"), cwd=open_dir, capture_output=True, text=True,
                       env={**os.environ, "H33_MARK": str(mark)}, timeout=60)
    assert r.returncode == 0, r.stderr
    assert not mark.exists(), mark.read_text()
    # the same module through a plain `python -m`: what every child used to be
    subprocess.run([sys.executable, "-m", "secrets"], cwd=open_dir, capture_output=True,
                   env={**os.environ, "H33_MARK": str(mark)}, timeout=60)
    assert mark.exists()  # so the planted module is where -m would look
