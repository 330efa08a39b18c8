"""The candidate's resource limits (kernelsearch.harness.limits), end to end through the child
process, run as root as the daemon runs (the worker becomes `nobody`, where RLIMIT_NPROC
applies): a fork or thread bomb in the launch wrapper, a spinning wrapper, a file past the size
limit and an open-file leak are each stopped with a named rule, nothing they started is left
running, and an honest candidate still passes under the default limits."""
import json
import os
import time
import uuid
from pathlib import Path

import pytest

from kernelsearch.harness import check
from kernelsearch.harness.limits import ENV, Limits
from tests.kernelsearch.test_sandbox import RED, cli, left_running

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="the worker drops to nobody as root")
# launch-wrapper bodies (run before the honest softmax's launch)
FORK_BOMB = ("    while True:\n"  # every child a `sleep` carrying $KS_REDTEAM_MARK
             "        if torch.os.fork() == 0:\n"
             "            torch.os.execv('/bin/sleep', ['sleep', '300'])\n")
THREAD_BOMB = ("    start = torch.os.sys.modules['_thread'].start_new_thread\n"  # past Thread.start
               "    while True:\n"
               "        start(torch.os.sys.modules['time'].sleep, (300,))\n")


def _assert_nothing_left(mark: str, tmpdir_open: Path) -> None:
    left = left_running(mark)
    assert not left, f"left running after the check: {len(left)} processes"
    assert list(tmpdir_open.iterdir()) == [], "temp dirs left behind by the check"


def _wrapper(body: str) -> str:
    """The honest softmax with `body` run first in its launch wrapper."""
    return (RED / "honest.py").read_text().replace(
        "def forward(x):\n", "def forward(x):\n" + body, 1)


@as_root
@pytest.mark.parametrize("body", [FORK_BOMB, THREAD_BOMB], ids=["fork", "thread"])
def test_a_process_or_thread_bomb_in_the_wrapper_is_stopped(body, tmpdir_open, monkeypatch):
    mark = uuid.uuid4().hex
    monkeypatch.setenv("KS_REDTEAM_MARK", mark)
    monkeypatch.setenv(ENV["tasks"], "48")
    t0 = time.time()
    v = check("softmax", _wrapper(body), timing=False, static_guard=False, timeout_s=120)
    assert (v.verdict, v.stage, v.code, v.rule) == ("rejected", "process", "crashed",
                                                    "process_limit"), v
    assert ENV["tasks"] in v.detail, v.detail
    assert time.time() - t0 < 60, "stopped at the limit, not at the timeout"
    assert v.sandbox["limits"]["tasks"] == 48 and v.sandbox["uid"] != 0, v.sandbox
    _assert_nothing_left(mark, tmpdir_open)


@as_root
def test_the_default_limits_stop_a_fork_bomb_and_leave_an_honest_candidate_room(
        tmpdir_open, monkeypatch):
    for var in ENV.values():
        monkeypatch.delenv(var, raising=False)
    mark = uuid.uuid4().hex
    monkeypatch.setenv("KS_REDTEAM_MARK", mark)
    v = check("softmax", _wrapper(FORK_BOMB), timing=False, static_guard=False, timeout_s=120)
    assert v.rule == "process_limit", v
    _assert_nothing_left(mark, tmpdir_open)
    v = check("softmax", RED / "honest.py", timing=True, timeout_s=300)
    assert v.accepted, v
    lim = v.sandbox["limits"]
    assert lim["tasks"] == Limits.defaults(300).tasks and lim["nproc_enforced"] is True
    assert lim["nproc_rlimit"] >= lim["tasks"] and lim["nofile"] == 1024
    assert v.sandbox["timeout_s"] == 300 and v.sandbox["landlock_abi"] >= 1


def test_a_spinning_wrapper_is_stopped_by_the_cpu_limit(tmpdir_open, monkeypatch):
    monkeypatch.setenv(ENV["cpu_s"], "30")
    v = check("softmax", _wrapper("    while True:\n        pass\n"), timing=False,
              static_guard=False, timeout_s=240)
    assert (v.stage, v.code, v.rule) == ("process", "crashed", "cpu_limit"), v
    assert "SIGXCPU" in v.detail and ENV["cpu_s"] in v.detail
    assert list(tmpdir_open.iterdir()) == []


def test_a_file_past_the_size_limit_is_refused(tmpdir_open, monkeypatch):
    monkeypatch.setenv(ENV["fsize_mb"], "16")
    body = ("    with open(torch.os.environ['TMPDIR'] + '/big', 'wb') as f:\n"
            "        f.write(bytes(17 << 20))\n")
    v = check("softmax", _wrapper(body), timing=False, static_guard=False, timeout_s=120)
    assert (v.stage, v.code, v.rule) == ("process", "crashed", "file_size_limit"), v
    assert "16 MiB" in v.detail and ENV["fsize_mb"] in v.detail
    assert list(tmpdir_open.iterdir()) == []


def test_an_open_file_leak_is_refused(tmpdir_open, monkeypatch):
    monkeypatch.setenv(ENV["nofile"], "256")
    body = "    leak = [open('/dev/null') for _ in range(100000)]\n"
    v = check("softmax", _wrapper(body), timing=False, static_guard=False, timeout_s=120)
    assert (v.stage, v.code, v.rule) == ("process", "crashed", "open_files_limit"), v
    assert "256" in v.detail


def test_cli_kernel_check_reports_the_limits_and_refuses_a_bad_one(tmp_path, tmpdir_open):
    p = cli("kernel", "check", "--family", "softmax", "--candidate", str(RED / "honest.py"),
            "--device", "cpu", "--no-timing", "--json", state=tmp_path,
            env={"TMPDIR": str(tmpdir_open), ENV["tasks"]: "96", ENV["nofile"]: "512"})
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["verdict"] == "accepted"
    assert d["sandbox"]["limits"]["tasks"] == 96 and d["sandbox"]["limits"]["nofile"] == 512
    assert list(tmpdir_open.iterdir()) == []
    p = cli("kernel", "check", "--family", "softmax", "--candidate", str(RED / "honest.py"),
            "--device", "cpu", "--json", state=tmp_path, env={ENV["tasks"]: "4"})
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert p.stderr.strip().count("\n") == 0 and ENV["tasks"] in p.stderr, p.stderr
    assert "Traceback" not in p.stderr


@pytest.mark.parametrize("value", ["0", "-3", "many", "1.5", "8"])
def test_a_bad_limit_is_one_clear_error(value, monkeypatch):
    monkeypatch.setenv(ENV["tasks"], value)
    with pytest.raises(ValueError, match=ENV["tasks"]):
        Limits.resolve(60)
    v = check("softmax", RED / "honest.py", timing=False)
    assert (v.code, v.rule) == ("crashed", "sandbox_limits") and ENV["tasks"] in v.detail, v


@as_root
def test_root_without_a_sandbox_user_is_held_by_the_parents_count(tmpdir_open, monkeypatch):
    """Root ignores RLIMIT_NPROC: with sandbox user `none` the parent's count of the tree is
    what stops the bomb."""
    mark = uuid.uuid4().hex
    monkeypatch.setenv("KS_REDTEAM_MARK", mark)
    monkeypatch.setenv(ENV["tasks"], "48")
    v = check("softmax", _wrapper(FORK_BOMB), timing=False, static_guard=False, timeout_s=120,
              sandbox_user="none")
    assert (v.code, v.rule) == ("crashed", "process_limit"), v
    assert "killed" in v.detail and v.sandbox["uid"] == 0
    _assert_nothing_left(mark, tmpdir_open)
