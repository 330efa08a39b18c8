"""The judge's child gets an allow-listed environment and no network, whatever the candidate
tries once past the static guard (switched off here, to test the layers behind it), through the
real `metaltune kernel check` CLI: a secret of the caller's environment never reaches the
candidate nor its verdict; a UDP datagram it sends to a listener on 127.0.0.1 never arrives
(as nobody, in its own network namespace, and as root with the sandbox user `none`)."""
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RED = Path(__file__).parent / "redteam"
SECRET = "hunter2-bmc-7f3a"

LEAKY = '''
import os
import socket

_seen = os.environ.get("METALTUNE_BMC_PASSWORD", "<none>")
_sent = []
for _fam, _addr in ((socket.AF_INET, ("127.0.0.1", {port})),):
    try:
        _s = socket.socket(_fam, socket.SOCK_DGRAM)
        _s.sendto(b"leak:" + _seen.encode(), _addr)
        _sent.append("sent")
    except OSError as e:
        _sent.append(type(e).__name__)


def forward(x):
    raise RuntimeError("env saw " + _seen + "; udp " + ",".join(_sent))
'''


@pytest.fixture
def listener():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    s.settimeout(0.5)
    yield s
    s.close()


def _received(s: socket.socket) -> list[bytes]:
    got = []
    try:
        while True:
            got.append(s.recv(4096))
    except (socket.timeout, BlockingIOError):
        return got


def _kernel_check(cand: Path, state: Path, extra_env: dict) -> subprocess.CompletedProcess:
    env = {**os.environ, "METALTUNE_BMC_PASSWORD": SECRET, **extra_env}
    return subprocess.run([sys.executable, str(Path(__file__).parent / "_cli_noguard.py"),
                           "--state-dir", str(state), "kernel", "check", "--family", "softmax",
                           "--candidate", str(cand), "--device", "cpu", "--no-timing", "--json"],
                          capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env={**env, "PYTHONPATH": str(ROOT)})


def test_the_leaky_candidate_is_heard_outside_the_sandbox(listener, tmp_path):
    """The control: the same code, run plainly, does reach the listener and the secret."""
    src = LEAKY.format(port=listener.getsockname()[1])
    env = {**os.environ, "METALTUNE_BMC_PASSWORD": SECRET}
    p = subprocess.run([sys.executable, "-c", src + "\nforward(None)"], capture_output=True,
                       text=True, env=env)
    assert SECRET in p.stderr and b"leak:" + SECRET.encode() in _received(listener)


@pytest.mark.parametrize("user", ["nobody", "none"])
def test_no_secret_and_no_datagram_leave_the_judge(listener, tmp_path, tmpdir_open, user):
    if user == "nobody" and os.geteuid() != 0:
        pytest.skip("the uid drop is for root callers")
    cand = tmp_path / "leaky.py"
    cand.write_text(LEAKY.format(port=listener.getsockname()[1]))
    p = _kernel_check(cand, tmp_path / "state", {"KERNELSEARCH_SANDBOX_USER": user})
    assert p.returncode == 1, p.stderr[-2000:]
    v = json.loads(p.stdout)
    assert v["verdict"] == "rejected"
    assert SECRET not in p.stdout and SECRET not in p.stderr
    assert "env saw <none>" in v["detail"], v["detail"]  # the candidate ran, and saw nothing
    assert "udp PermissionError" in v["detail"], v["detail"]
    assert _received(listener) == []
    layers = v["sandbox"]["network"]
    assert "seccomp" in layers and (("netns" in layers) == (os.geteuid() == 0)), layers
