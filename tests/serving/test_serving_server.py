"""The engine server's process handling (tuner/workloads/serving/server.py) against a stand-in
that makes it hard: SIGTERM ignored by the server and its grandchild, a port held, /health that
never answers. The real engine's start, failure and stop are in test_serving_engine.py."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tuner.workloads.serving.server import EngineFailed, EngineServer, port_free

FAKE = str(Path(__file__).with_name("fake_engine"))


def _server(tmp_path, hang: bool = False, timeout: float = 30.0) -> EngineServer:
    env = {"PYTHONPATH": FAKE, "FAKE_ENGINE_PIDS": str(tmp_path / "pids")}
    if hang:
        env["FAKE_ENGINE"] = "hang"
    return EngineServer(sys.executable, "m", [], env, start_timeout_s=timeout, grace_s=1.0)


def _pids(tmp_path) -> list[int]:
    return [int(p) for p in (tmp_path / "pids").read_text().split()]


def _gone(pids: list[int]) -> bool:
    return not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
                   for p in pids)


def test_stop_kills_the_whole_group_that_ignores_sigterm_and_frees_the_port(tmp_path):
    srv = _server(tmp_path).start()
    assert srv.ready_s is not None and not port_free(srv.port)
    pids = _pids(tmp_path)
    t0 = time.monotonic()
    srv.stop()
    assert time.monotonic() - t0 < 10
    assert _gone(pids) and port_free(srv.port)


def test_a_server_that_never_gets_healthy_times_out_with_nothing_left(tmp_path):
    srv = _server(tmp_path, hang=True, timeout=3.0)
    with pytest.raises(EngineFailed) as e:
        srv.start()
    assert e.value.code == "engine_timeout" and "not ready in 3s" in str(e.value)
    assert _gone(_pids(tmp_path)) and port_free(srv.port)


def test_the_server_dies_with_its_parent(tmp_path):
    """A parent killed with SIGKILL runs no clean-up: the kernel's death signal stops the server."""
    code = ("import os, sys; sys.path.insert(0, %r)\n"
            "from tests.serving.test_serving_server import _server\n"
            "from pathlib import Path\n"
            "s = _server(Path(%r)).start(); print(s.port, flush=True); os.kill(os.getpid(), 9)"
            % (str(Path(__file__).resolve().parents[2]), str(tmp_path)))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    port = int(out.stdout.split()[0])
    leader = _pids(tmp_path)[0]
    deadline = time.monotonic() + 10
    while not _gone([leader]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _gone([leader])
    # its own grandchild is in the same group: the killed leader no longer holds the port
    for pid in _pids(tmp_path)[1:]:
        if psutil.pid_exists(pid):
            os.kill(pid, 9)
    deadline = time.monotonic() + 10
    while not port_free(port) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert port_free(port)
