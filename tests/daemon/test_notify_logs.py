"""sd_notify against a bound NOTIFY_SOCKET, and the key=value log lines."""
from __future__ import annotations

import io
import os
import socket

from tuner.daemon import logs
from tuner.daemon.notify import Notifier


def _recv_all(s: socket.socket) -> list[dict[str, str]]:
    out = []
    s.settimeout(0.2)
    while True:
        try:
            data = s.recv(4096)
        except socket.timeout:
            return out
        out.append(dict(line.split("=", 1) for line in data.decode().splitlines()))


def test_notify_protocol_over_a_bound_socket(tmp_path):
    path = str(tmp_path / "notify.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(path)
    env = {"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "4000000", "WATCHDOG_PID": str(os.getpid())}
    n = Notifier(env)
    assert "NOTIFY_SOCKET" not in env and "WATCHDOG_USEC" not in env  # children never inherit it
    assert n.watchdog_interval() == 2.0
    assert n.ready("running; profile x verified")
    assert n.watchdog() and n.status("multi\nline") and n.reloading() and n.stopping()
    msgs = _recv_all(s)
    assert msgs[0]["READY"] == "1" and msgs[0]["STATUS"] == "running; profile x verified"
    assert msgs[0]["MAINPID"] == str(os.getpid())
    assert msgs[1] == {"WATCHDOG": "1"}
    assert msgs[2] == {"STATUS": "multi line"}
    assert msgs[3]["RELOADING"] == "1" and int(msgs[3]["MONOTONIC_USEC"]) > 0
    assert msgs[4]["STOPPING"] == "1"
    s.close()


def test_abstract_socket_and_foreign_watchdog_pid():
    name = f"metaltune-test-{os.getpid()}"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind("\0" + name)
    n = Notifier({"NOTIFY_SOCKET": "@" + name, "WATCHDOG_USEC": "1000000", "WATCHDOG_PID": "1"})
    assert n.watchdog_interval() is None  # the watchdog was meant for another process
    assert n.ready("up")
    assert _recv_all(s)[0]["READY"] == "1"
    s.close()


def test_without_systemd_nothing_is_sent_and_nothing_fails(tmp_path):
    n = Notifier({})
    assert not n.enabled and n.ready("x") is False and n.watchdog_interval() is None
    gone = Notifier({"NOTIFY_SOCKET": str(tmp_path / "missing.sock")})
    assert gone.ready("x") is False  # systemd went away: the daemon carries on


def test_log_lines_are_greppable_key_value():
    buf = io.StringIO()
    logs.configure("info", stream=buf)
    try:
        logs.log("rollback", level="warning", txn=3, knobs=["gpu0.power_limit_w"],
                 reason="instability_xid: fatal xid gpu 0: Xid 79", state="rolled_back", x=None)
        logs.log("debugging", level="debug", hidden=True)
        import logging

        logging.getLogger("safety.test").warning("from a library")
    finally:
        logs.unconfigure()  # later tests must not find their logs on stdout
    lines = buf.getvalue().splitlines()
    assert len(lines) == 2
    first = lines[0]
    assert "level=warning event=rollback txn=3 " in first
    assert 'reason="instability_xid: fatal xid gpu 0: Xid 79"' in first
    assert 'knobs="[\\"gpu0.power_limit_w\\"]"' in first and "state=rolled_back" in first and "x=null" in first
    assert "event=log logger=safety.test" in lines[1] and 'msg="from a library"' in lines[1]


def test_a_reader_that_stops_reading_never_blocks_the_daemon(tmp_path):
    path = str(tmp_path / "full.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(path)  # bound, never read: its queue fills up
    n = Notifier({"NOTIFY_SOCKET": path})
    import time

    t0 = time.monotonic()
    sent = [n.watchdog() for _ in range(500)]
    assert time.monotonic() - t0 < 2.0 and sent[0] and not sent[-1]
    s.close()
