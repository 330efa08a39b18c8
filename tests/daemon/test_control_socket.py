"""The control socket: root-only (mode and SO_PEERCRED), line-delimited JSON, concurrent clients,
and the client's fallback when no daemon runs. A real Unix socket server, real clients."""
from __future__ import annotations

import json
import os
import socket
import stat
import threading
import time

import pytest

from tuner.daemon import client
from tuner.daemon.server import ControlServer
from tuner.errors import BadInput, OperationFailed

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (runs a client as nobody)")


def _handler(op, args, peer):
    if op == "echo":
        return {"args": args, "uid": peer.uid, "pid": peer.pid}
    if op == "slow":
        time.sleep(args.get("s", 0.2))
        return {"slept": args.get("s", 0.2)}
    if op == "bad":
        raise BadInput("profile x.yaml: field knobs: expected a mapping")
    if op == "boom":
        raise RuntimeError("kaboom")
    raise BadInput(f"unknown operation {op!r}")


@pytest.fixture
def server(monkeypatch):
    import shutil
    import tempfile
    from pathlib import Path

    # a world-traversable parent, so only the run dir's and the socket's own modes keep others out
    top = Path(tempfile.mkdtemp(prefix="mt-sock-"))
    os.chmod(top, 0o755)
    run = top / "run"
    monkeypatch.setenv("METALTUNE_RUN_DIR", str(run))
    monkeypatch.delenv(client.NO_DAEMON_ENV, raising=False)
    s = ControlServer(run, _handler, allowed_uids=frozenset({0, os.geteuid()}))
    s.start()
    yield s
    s.stop()
    shutil.rmtree(top)


def test_socket_mode_and_round_trip(server):
    st = os.stat(server.path)
    assert stat.S_ISSOCK(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o600
    assert stat.S_IMODE(os.stat(server.run_dir).st_mode) == 0o700
    res = client.try_call("echo", {"a": [1, 2], "json": True})
    assert res["args"] == {"a": [1, 2], "json": True}
    assert res["uid"] == os.geteuid() and res["pid"] == os.getpid()


def test_errors_keep_their_exit_code(server):
    with pytest.raises(BadInput, match="field knobs"):
        client.try_call("bad", {})
    with pytest.raises(OperationFailed, match="kaboom") as ei:
        client.try_call("boom", {})
    assert ei.value.exit_code == 1


def test_malformed_requests_get_one_clear_error(server):
    s = socket.socket(socket.AF_UNIX)
    s.connect(str(server.path))
    f = s.makefile("rwb")
    for line, want in [(b"not json\n", "not JSON"), (b'{"args": {}}\n', "field op"),
                       (b'{"op": "echo", "args": [1]}\n', "field args"),
                       (b'{"op": "echo", "extra": 1}\n', "field extra")]:
        f.write(line)
        f.flush()
        resp = json.loads(f.readline())
        assert resp["ok"] is False and resp["exit_code"] == 2 and want in resp["error"], resp
    # the connection still serves a good request afterwards
    f.write(b'{"op": "echo", "args": {"x": 1}}\n')
    f.flush()
    assert json.loads(f.readline())["result"]["args"] == {"x": 1}
    s.close()


def test_concurrent_clients(server):
    out, errs = [], []

    def one(i):
        try:
            out.append(client.try_call("echo", {"i": i})["args"]["i"])
        except Exception as e:  # pragma: no cover - reported below
            errs.append(e)

    slow = threading.Thread(target=client.try_call, args=("slow", {"s": 5.0}))
    slow.start()
    ths = [threading.Thread(target=one, args=(i,)) for i in range(20)]
    [t.start() for t in ths]
    [t.join() for t in ths]
    assert not errs and sorted(out) == list(range(20))
    assert slow.is_alive(), "a slow request must not block other clients"
    slow.join()


def test_no_daemon_means_none(tmp_path, monkeypatch):
    monkeypatch.setenv("METALTUNE_RUN_DIR", str(tmp_path / "nothing"))
    monkeypatch.delenv(client.NO_DAEMON_ENV, raising=False)
    assert client.try_call("status", {}) is None
    # a stale socket left by a daemon that died: also None (the CLI works directly)
    (tmp_path / "nothing").mkdir()
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(tmp_path / "nothing" / "control.sock"))
    s.close()
    assert client.try_call("status", {}) is None
    with pytest.raises(OperationFailed, match="no metaltune daemon"):
        client.call("status")


def test_second_server_refuses_while_first_runs(server):
    from tuner.errors import MetaltuneError

    with pytest.raises(MetaltuneError, match="already running"):
        ControlServer(server.run_dir, _handler).start()


def _as_nobody(fn):
    """Run fn() in a forked child as uid/gid 65534; return what it returned (a str)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            msg = fn()
        except BaseException as e:
            msg = f"exception {type(e).__name__}: {e}"
        os.write(w, msg.encode()[:4000])
        os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 4096):
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    return data.decode()


def _raw_request(path):
    def fn():
        s = socket.socket(socket.AF_UNIX)
        try:
            s.connect(str(path))
        except OSError as e:
            return f"connect {type(e).__name__}"
        try:
            s.sendall(b'{"op": "echo", "args": {}}\n')
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused before our request was read: the refusal is still waiting for us
        return s.makefile("rb").readline().decode()
    return fn


@root_only
def test_nobody_cannot_open_the_socket(server):
    # the directory (0700) and the socket (0600) keep other users out...
    assert _as_nobody(_raw_request(server.path)) == "connect PermissionError"
    # ...and the CLI says so instead of silently working around the daemon
    out = _as_nobody(lambda: repr(client.try_call("echo", {})))
    assert "OperationFailed" in out and "root-only" in out


@root_only
def test_peercred_refuses_nobody_even_with_open_modes(monkeypatch):
    # defence in depth: with the modes loosened (a mistake, a passed fd), SO_PEERCRED still refuses
    import shutil
    import tempfile
    from pathlib import Path

    top = Path(tempfile.mkdtemp(prefix="mt-peercred-"))  # pytest's tmp is 0700: nobody cannot reach it
    run = top / "run"
    s = ControlServer(run, _handler)  # default: uid 0 only
    s.start()
    try:
        os.chmod(top, 0o755)
        os.chmod(run, 0o755)
        os.chmod(s.path, 0o666)
        line = _as_nobody(_raw_request(s.path))
        resp = json.loads(line)
        assert resp["ok"] is False and "root-only (uid 65534)" in resp["error"]
        # root is still served
        monkeypatch.setenv("METALTUNE_RUN_DIR", str(run))
        monkeypatch.delenv(client.NO_DAEMON_ENV, raising=False)
        assert client.try_call("echo", {"k": 1})["args"] == {"k": 1}
    finally:
        s.stop()
        shutil.rmtree(top)
