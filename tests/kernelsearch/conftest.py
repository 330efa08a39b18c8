"""Kernel tests run Triton's interpreter on the CPU: set before any kernel module is loaded."""
import os
import subprocess
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")
# the red-team candidates read where to aim from these; the judge child's environment is an
# allow-list, so the tests name them as an operator would name a variable to pass on
os.environ.setdefault("KERNELSEARCH_SANDBOX_PASS_ENV", "KS_REDTEAM_TARGET,KS_REDTEAM_MARK")

REDTEAM = Path(__file__).parent / "redteam"


@pytest.fixture
def redteam():
    return lambda name: REDTEAM / f"{name}.py"


@pytest.fixture
def tmpdir_open(monkeypatch):
    """A TMPDIR of our own that others may enter (0755 under /tmp): the harness's temp dirs go
    there, so what it leaves behind can be counted."""
    d = Path(tempfile.mkdtemp(prefix="ks-test-tmp-", dir="/tmp"))
    d.chmod(0o755)
    monkeypatch.setenv("TMPDIR", str(d))
    monkeypatch.setattr(tempfile, "tempdir", None)
    yield d
    subprocess.run(["rm", "-rf", str(d)], check=False)
