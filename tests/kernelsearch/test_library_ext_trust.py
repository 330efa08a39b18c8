"""$METALTUNE_FLASHMLA_EXT names code that root loads (issue 33, item 2): a file that another
user can write, or that sits in a directory another user can write, is refused in one line
(`metaltune kernel families` exits 2) and never loaded; the library is then absent for dispatch
(DispatchTable.choose's library fallback, the daemon's search child)."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.simhelpers import REPO

STANDIN = '__version__ = "0.0-standin"\n'


def _ext(path: Path, marker: Path) -> Path:
    path.write_text(f"open({str(marker)!r}, 'w').write(str(__import__('os').geteuid()))\n"
                    "def dense_decode_fwd():\n    return 'ext'\n")
    return path


def _families(tmp_path: Path, ext: Path) -> subprocess.CompletedProcess:
    lib = tmp_path / "lib" / "flash_mla"  # a stand-in flash_mla (the extensions load with it)
    lib.mkdir(parents=True, exist_ok=True)
    (lib / "__init__.py").write_text(STANDIN)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(tmp_path / "lib")]),
           "METALTUNE_FLASHMLA_EXT": str(ext), "METALTUNE_STATE_DIR": str(tmp_path / "state")}
    return subprocess.run([sys.executable, "-m", "tuner", "kernel", "families"], env=env,
                          capture_output=True, text=True, timeout=300, cwd=REPO)


@pytest.fixture
def open_dir():
    """A directory everyone can write (no sticky bit), root's: what an operator may point at."""
    d = Path(tempfile.mkdtemp(prefix="h33-ext-", dir="/tmp"))
    os.chmod(d, 0o777)
    yield d
    subprocess.run(["rm", "-rf", str(d)])


@pytest.mark.parametrize("how", ["open dir", "open file", "other owner"])
def test_kernel_families_refuses_an_extension_others_can_write_and_never_loads_it(
        tmp_path, open_dir, how):
    marker = tmp_path / "loaded"
    if how == "open dir":
        ext = _ext(open_dir / "dense_part.py", marker)  # the file root's 0644, its dir 0777
        os.chmod(ext, 0o644)
    else:
        (tmp_path / "safe").mkdir()
        ext = _ext(tmp_path / "safe" / "dense_part.py", marker)
        if how == "open file":
            os.chmod(ext, 0o666)
        elif os.geteuid() == 0:
            os.chown(ext, 65534, 65534)
        else:
            pytest.skip("chown to another user needs root")
    r = _families(tmp_path, ext)
    assert r.returncode == 2, (r.returncode, r.stdout[-500:], r.stderr[-2000:])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "METALTUNE_FLASHMLA_EXT" in lines[0] and str(ext) in lines[0] \
        and "Traceback" not in r.stderr, r.stderr
    assert not marker.exists(), f"the extension ran (as uid {marker.read_text()})"


def test_an_extension_root_owns_in_trusted_dirs_still_loads(tmp_path):
    marker = tmp_path / "loaded"
    (tmp_path / "safe").mkdir()
    ext = _ext(tmp_path / "safe" / "dense_part.py", marker)
    r = _families(tmp_path, ext)
    assert r.returncode == 0, r.stderr[-2000:]
    assert marker.read_text() == str(os.geteuid())
    assert "library flash_mla: present" in r.stdout, r.stdout[-1500:]


def test_dispatch_sees_a_refused_extension_as_no_library(tmp_path, open_dir, monkeypatch,
                                                         caplog):
    from kernelsearch import libraries

    marker = tmp_path / "loaded"
    lib = tmp_path / "lib" / "flash_mla"
    lib.mkdir(parents=True)
    (lib / "__init__.py").write_text(STANDIN)
    monkeypatch.syspath_prepend(str(tmp_path / "lib"))
    monkeypatch.setenv(libraries.FLASHMLA_EXT_ENV, str(_ext(open_dir / "part.py", marker)))
    libraries.reset()
    try:
        f = libraries.discover("flash_mla")
        assert f.status == "absent" and "refusing to load" in f.reason, f
        assert not libraries.available("flash_mla") and not marker.exists()
        assert any("treated as absent" in r.getMessage() for r in caplog.records)
    finally:
        libraries.reset()
        sys.modules.pop("flash_mla", None)
