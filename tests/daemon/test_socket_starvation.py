"""The control socket under a hostile or careless local client: half-open and trickling
connections are timed out, root's status/rollback get a reserved slot, requests are validated
by the operations' own models (exit 2), and deep nesting or oversized lines get one clear error
while the daemon keeps serving. A real Unix socket server, real clients; the last test goes
through the real daemon process."""
from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import threading
import time
from pathlib import Path

import pytest

from tuner.daemon import client, server as srv
from tuner.daemon.server import ControlServer
from tuner.errors import BadInput, OperationFailed

from tests.daemon.conftest import write_config


IDLE = 2.0  # the server's idle timeout, shortened for the test
RESERVED = getattr(srv, "RESERVED", 4)
RESERVED_TIMEOUT_S = getattr(srv, "RESERVED_TIMEOUT_S", 1.0)
MAX_DEPTH = getattr(srv, "MAX_DEPTH", 32)


def _handler(op, args, peer):
    if op in ("echo", "status", "rollback"):
        return {"op": op, "args": args}
    raise BadInput(f"unknown operation {op!r}")


@pytest.fixture
def server(monkeypatch):
    top = Path(tempfile.mkdtemp(prefix="mt-starve-"))
    os.chmod(top, 0o755)
    monkeypatch.setenv("METALTUNE_RUN_DIR", str(top / "run"))
    monkeypatch.delenv(client.NO_DAEMON_ENV, raising=False)
    monkeypatch.setattr(srv, "IDLE_TIMEOUT_S", IDLE, raising=False)
    s = ControlServer(top / "run", _handler, allowed_uids=frozenset({0, os.geteuid()}))
    s.start()
    yield s
    s.stop()
    shutil.rmtree(top)


def _half_open(path, n):
    socks = []
    for _ in range(n):
        c = socket.socket(socket.AF_UNIX)
        c.connect(str(path))
        socks.append(c)
    return socks


def test_half_open_connections_do_not_starve_status_or_rollback(server):
    hogs = _half_open(server.path, srv.MAX_CLIENTS)  # every ordinary slot
    try:
        time.sleep(0.2)
        t0 = time.monotonic()
        assert client.try_call("status", {})["op"] == "status"
        assert client.try_call("rollback", {})["op"] == "rollback"
        assert time.monotonic() - t0 < 1.0, "root's status/rollback waited for the hogs"
        # the reserved slots taken too: a hog there is dropped after RESERVED_TIMEOUT_S
        hogs += _half_open(server.path, RESERVED + 4)
        time.sleep(0.2)
        t0 = time.monotonic()
        assert client.try_call("rollback", {})["op"] == "rollback"
        assert time.monotonic() - t0 < RESERVED_TIMEOUT_S + 2
        # an ordinary request waits for the idle timeout to free a slot, then gets through
        t0 = time.monotonic()
        assert client.try_call("echo", {"x": 1})["args"] == {"x": 1}
        assert time.monotonic() - t0 < IDLE + 4
        # the hogs were dropped: the server closed them
        hogs[0].settimeout(5)
        assert hogs[0].recv(100) == b""
    finally:
        for h in hogs:
            h.close()


def test_a_trickling_client_is_cut_off_with_a_reason(server):
    c = socket.socket(socket.AF_UNIX)
    c.connect(str(server.path))
    c.settimeout(10)
    t0 = time.monotonic()
    answer = b""
    try:
        for ch in b'{"op": "echo", "args": {"padding": "' + b"x" * 100:
            c.sendall(bytes([ch]))
            time.sleep(0.05)
    except (BrokenPipeError, ConnectionResetError):
        pass
    answer = c.makefile("rb").readline()
    c.close()
    resp = json.loads(answer)
    assert resp["ok"] is False and resp["exit_code"] == 2 and "no complete line" in resp["error"]
    assert time.monotonic() - t0 < IDLE + 3


def test_deep_nesting_is_an_error_answer_and_the_handler_lives_on(server):
    c = socket.socket(socket.AF_UNIX)
    c.settimeout(30)
    c.connect(str(server.path))
    f = c.makefile("rwb")
    for depth in (100_000, MAX_DEPTH + 5):
        f.write(b'{"op": "echo", "args": {"a": ' + b"[" * depth + b"]" * depth + b"}}\n")
        f.flush()
        resp = json.loads(f.readline())
        assert resp["ok"] is False and resp["exit_code"] == 2 and "nested deeper" in resp["error"]
    f.write(b'{"op": "echo", "args": {"a": [[1]]}}\n')  # same connection, still served
    f.flush()
    assert json.loads(f.readline())["result"]["args"] == {"a": [[1]]}
    c.close()


def test_oversized_line_refused_and_200_concurrent_clients_served(server):
    c = socket.socket(socket.AF_UNIX)
    c.settimeout(30)
    c.connect(str(server.path))
    try:
        c.sendall(b'{"op": "echo", "args": {"a": "' + b"x" * (srv.MAX_LINE + 10) + b'"}}\n')
    except (BrokenPipeError, ConnectionResetError):
        pass
    resp = json.loads(c.makefile("rb").readline())
    assert resp["exit_code"] == 2 and "longer than 1 MiB" in resp["error"]
    c.close()
    out, errs = [], []

    def one(i):
        try:
            out.append(client.try_call("echo", {"i": i})["args"]["i"])
        except Exception as e:
            errs.append(e)

    ths = [threading.Thread(target=one, args=(i,)) for i in range(200)]
    [t.start() for t in ths]
    [t.join() for t in ths]
    assert not errs and sorted(out) == list(range(200)), errs[:3]


def test_reserved_slot_serves_priority_ops_only(server, monkeypatch):
    hogs = _half_open(server.path, srv.MAX_CLIENTS)
    try:
        time.sleep(0.2)
        monkeypatch.setattr(client, "BUSY_RETRY_S", 0.0)
        with pytest.raises(OperationFailed, match="daemon busy"):
            client.try_call("echo", {})
    finally:
        for h in hogs:
            h.close()


def test_operation_arguments_validated_by_the_operation_model():
    from tuner import ops
    from tuner.ops.args import validate

    fn = ops.get("trials")
    assert validate("trials", fn, {"limit": 5}) == {"limit": 5}
    with pytest.raises(BadInput, match="trials: argument limit: Input should be a valid integer"):
        validate("trials", fn, {"limit": "x"})
    with pytest.raises(BadInput, match="trials: argument bogus: unknown argument"):
        validate("trials", fn, {"bogus": 1})
    with pytest.raises(BadInput, match="finite"):
        validate("apply", ops.get("apply"), {"profile": "p", "probation_s": float("inf")})
    with pytest.raises(BadInput, match="status: argument incidents"):
        validate("status", ops.get("status"), {"incidents": [1]})


def test_daemon_answers_wrong_argument_types_with_exit_2(tmp_path, sim_host, start_daemon):
    d = start_daemon(write_config(tmp_path / "d.toml", sim_host, tmp_path))
    d.wait_ready()
    for op, args, field in [("trials", {"limit": "x"}, "limit"),
                            ("status", {"incidents": {"a": 1}}, "incidents"),
                            ("verify", {"profile": 3.5, "zzz": 1}, "")]:
        resp = d.call(op, **args)
        assert resp["ok"] is False and resp["exit_code"] == 2, resp
        assert resp["kind"] == "BadInput" and f"{op}: argument {field}" in resp["error"], resp
        assert "Traceback" not in resp["error"] and "sqlite" not in resp["error"].lower()
    resp = d.call("status")  # and it still answers (an unknown key such as json=True is bad input too)
    assert resp["ok"] is True
    r = d.cli("trials", "--limit", "3", "--json", check=False)
    assert r.returncode == 0, r.stderr
    assert d.stop() == 0
