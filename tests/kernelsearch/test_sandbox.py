"""Candidate code runs confined: kernel bodies are guarded like `forward`, and with the guard
bypassed the child process itself holds (run as root here, as the daemon runs): no file outside
its temp dir is removed or created, no process it started outlives the check, and no temp dir
of the harness is left behind."""
import json
import os
import stat
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil
import pytest

from kernelsearch.harness import check

ROOT = Path(__file__).resolve().parents[2]
RED = Path(__file__).parent / "redteam"
RUNTIME = ["jit_removes_file", "jit_writes_outside", "jit_forks_daemon"]
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="the privilege drop is for root callers")


def _marked(mark: str) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter():
        try:
            if p.environ().get("KS_REDTEAM_MARK") == mark:
                out.append(p)
        except psutil.Error:
            pass
    return out


def left_running(mark: str, wait_s: float = 5.0) -> list[int]:
    """Pids of processes carrying `mark` still running after up to `wait_s` (killed now, so
    none outlives the test)."""
    deadline = time.time() + wait_s
    while _marked(mark) and time.time() < deadline:
        time.sleep(0.1)
    left = _marked(mark)
    for p in left:
        p.kill()
    return [p.pid for p in left]


@pytest.mark.parametrize("name", RUNTIME)
def test_guard_rejects_os_access_in_kernel_bodies(redteam, name, tmp_path, monkeypatch):
    target = tmp_path / "precious"
    target.write_text("x")
    monkeypatch.setenv("KS_REDTEAM_TARGET", str(target))
    v = check("softmax", redteam(name), timing=False)
    assert (v.verdict, v.stage, v.code, v.rule) == ("rejected", "guard", "guard_failed",
                                                    "jit_body"), v
    assert "torch" in v.detail and target.read_text() == "x"


@as_root
def test_sandbox_holds_a_remove_in_a_kernel_body(redteam, tmpdir_open, tmp_path, monkeypatch):
    victim_dir = tmp_path / "root-owned"
    victim_dir.mkdir(mode=0o755)
    target = victim_dir / "precious"
    target.write_text("x")
    monkeypatch.setenv("KS_REDTEAM_TARGET", str(target))
    v = check("softmax", redteam("jit_removes_file"), timing=False, static_guard=False,
              timeout_s=120)
    assert target.read_text() == "x", "the candidate deleted a root-owned file"
    assert v.verdict == "rejected" and "PermissionError" in v.detail, v
    assert list(tmpdir_open.iterdir()) == []


@as_root
def test_sandbox_holds_a_write_outside_its_temp_dir(redteam, tmpdir_open, monkeypatch):
    """A world-writable, sticky dir (like /tmp): the unprivileged uid could create a file there;
    Landlock is what stops it."""
    open_dir = Path(tempfile.mkdtemp(prefix="ks-test-open-", dir="/tmp"))
    open_dir.chmod(0o1777)
    target = open_dir / "planted"
    monkeypatch.setenv("KS_REDTEAM_TARGET", str(target))
    try:
        v = check("softmax", redteam("jit_writes_outside"), timing=False, static_guard=False,
                  timeout_s=120)
        assert not target.exists(), "the candidate wrote outside its temp dir"
        assert v.verdict == "rejected" and "PermissionError" in v.detail, v
    finally:
        subprocess.run(["rm", "-rf", str(open_dir)], check=False)
    assert list(tmpdir_open.iterdir()) == []


def test_sandbox_kills_a_setsid_daemon_started_by_a_kernel_body(redteam, tmpdir_open,
                                                                  monkeypatch):
    mark = uuid.uuid4().hex
    monkeypatch.setenv("KS_REDTEAM_MARK", mark)
    v = check("softmax", redteam("jit_forks_daemon"), timing=False, static_guard=False,
              timeout_s=120)
    assert v.verdict in ("accepted", "rejected"), v  # what matters is what is left running
    left = left_running(mark)
    assert not left, f"left running after the check: {left}"
    assert list(tmpdir_open.iterdir()) == []


def test_timeout_kills_the_daemon_too(tmpdir_open, monkeypatch):
    """Killed at the deadline: the setsid'd grandchild goes with the child."""
    mark = uuid.uuid4().hex
    monkeypatch.setenv("KS_REDTEAM_MARK", mark)
    src = (RED / "jit_forks_daemon.py").read_text().replace(
        "    row = tl.program_id(0).to(tl.int64)\n",
        "    while True:\n        pass\n    row = tl.program_id(0).to(tl.int64)\n", 1)
    v = check("softmax", src, timing=False, static_guard=False, timeout_s=15)
    assert v.code == "timeout", v
    time.sleep(0.5)
    left = _marked(mark)
    for p in left:
        p.kill()
    assert not left, f"left running after the timeout: {[p.pid for p in left]}"


@as_root
def test_candidate_runs_unprivileged_with_its_own_tmp(tmpdir_open):
    """What the worker sees: not root, no groups, TMPDIR and Triton's cache inside its dir."""
    # the probe reports through the verdict: a failing assertion's message comes back
    src = (RED / "honest.py").read_text().replace("import torch\n", "import os\nimport torch\n", 1).replace(
        "def forward(x):\n",
        "def forward(x):\n    assert False, repr((os.getuid(), os.getgroups(), "
        "os.environ['TMPDIR'], os.environ['TRITON_CACHE_DIR']))\n", 1)
    v = check("softmax", src, timing=False, static_guard=False, timeout_s=120)
    assert v.code == "crashed", v
    uid, groups, tmp, cache = eval(v.detail[v.detail.index("("):])
    assert uid != 0 and groups == []
    assert tmp.startswith(str(tmpdir_open)) and cache.startswith(str(Path(tmp).parent))


@as_root
def test_sandbox_user_choice_fails_closed_or_opts_out_explicitly(tmpdir_open, monkeypatch):
    v = check("softmax", RED / "honest.py", timing=False, sandbox_user="no-such-user-h15")
    assert (v.code, v.rule) == ("crashed", "sandbox_user"), v
    # `none`: the caller's uid is kept, Landlock still confines writes
    open_dir = Path(tempfile.mkdtemp(prefix="ks-test-open-", dir="/tmp"))
    open_dir.chmod(0o1777)
    monkeypatch.setenv("KS_REDTEAM_TARGET", str(open_dir / "planted"))
    try:
        v = check("softmax", RED / "jit_writes_outside.py", timing=False, static_guard=False,
                  sandbox_user="none", timeout_s=120)
        assert v.verdict == "rejected" and not (open_dir / "planted").exists(), v
    finally:
        subprocess.run(["rm", "-rf", str(open_dir)], check=False)


def cli(*args, state, env=None):
    return subprocess.run([sys.executable, "-m", "tuner", "--state-dir", str(state), *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env={**os.environ, **(env or {})})


def test_cli_kernel_check_rejects_a_body_that_deletes_and_leaves_no_temp_dirs(tmp_path,
                                                                              tmpdir_open):
    target = tmp_path / "precious"
    target.write_text("x")
    p = cli("kernel", "check", "--family", "softmax", "--candidate",
            str(RED / "jit_removes_file.py"), "--device", "cpu", "--json", state=tmp_path,
            env={"KS_REDTEAM_TARGET": str(target), "TMPDIR": str(tmpdir_open)})
    assert p.returncode == 1, p.stderr
    d = json.loads(p.stdout)
    assert (d["stage"], d["code"], d["rule"]) == ("guard", "guard_failed", "jit_body"), d
    assert target.read_text() == "x"
    p = cli("kernel", "check", "--family", "softmax", "--candidate", str(RED / "honest.py"),
            "--device", "cpu", "--json", state=tmp_path, env={"TMPDIR": str(tmpdir_open)})
    assert p.returncode == 0, p.stderr
    assert list(tmpdir_open.iterdir()) == [], "temp dirs left behind by the check"


def test_in_process_judge_removes_its_candidate_dirs(redteam, tmpdir_open):
    v = check("softmax", redteam("honest"), isolate=False, timing=False)
    assert v.accepted, v
    assert [p.name for p in tmpdir_open.iterdir()] == []
