"""A fatal incident always ends in a rollback, or in a journalled reason why not, however busy
the daemon is (issue 15, item 1): a rollback that has to wait for the writer is queued and
retried until done (and survives a restart), and de-duplication never hides an incident that
belongs to a different change. Through the real daemon on a simulated host."""
from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from tests.daemon.conftest import metaltune, base_env, power_limit_w, write_config, write_profile

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the daemon's socket is root-only")


def _rows(state: Path, sql: str) -> list[dict]:
    """Straight from the journal file with SQLite, read-only: what is recorded, not what the
    code under test says about it."""
    c = sqlite3.connect(f"file:{state / 'journal.db'}?mode=ro", uri=True, timeout=30)
    c.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in c.execute(sql).fetchall()]
    finally:
        c.close()


def incidents(state: Path) -> list[dict]:
    return [{"action": None, **r} for r in _rows(state, "SELECT * FROM incidents ORDER BY id")]


def open_txns(state: Path) -> list[dict]:
    return _rows(state, "SELECT * FROM txns WHERE state IN ('intent', 'probation', 'rolling_back')")


def wait_for(pred, timeout: float = 20.0, what: str = ""):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what or pred}")


def test_a_second_xid_after_a_new_change_is_journalled_and_rolls_that_change_back(
        tmp_path, sim_host, start_daemon):
    cfg = write_config(tmp_path / "config.toml", sim_host, tmp_path)
    d = start_daemon(cfg)
    d.wait_ready()
    env = base_env(tmp_path / "run")
    a = write_profile(tmp_path / "a.yaml", 600)
    assert d.call("apply", profile=str(a), probation_s=0.3)["ok"]
    metaltune("sim", "inject", str(sim_host), "xid", "79", env=env)
    wait_for(lambda: power_limit_w(sim_host) == 700, what="the first rollback")
    first = [i for i in incidents(tmp_path / "state") if i["xid"] == 79]
    assert len(first) == 1  # seen by two monitors (NVML events, kernel log): journalled once

    # a new change confirmed within DEDUP_S of the first Xid, then the same Xid again
    c = write_profile(tmp_path / "c.yaml", 650)
    r = d.call("apply", profile=str(c), probation_s=0.3)
    assert r["ok"], r
    txn_c = r["result"]["transaction"]
    assert power_limit_w(sim_host) == 650
    metaltune("sim", "inject", str(sim_host), "xid", "79", env=env)
    wait_for(lambda: power_limit_w(sim_host) == 700, what="the second rollback")
    xids = [i for i in incidents(tmp_path / "state") if i["xid"] == 79]
    assert len(xids) == 2, xids
    assert xids[1]["time"] - xids[0]["time"] < 10.0  # inside the daemon's de-duplication window
    assert xids[1]["txn_id"] == txn_c and xids[1]["txn_id"] != xids[0]["txn_id"]
    assert all((i["action"] or "").startswith("rolled back") for i in xids), xids
    assert d.call("status")["result"]["current"]["gpu0.power_limit_w"] == 700
    assert d.stop() == 0


def test_an_xid_during_a_write_in_flight_is_rolled_back_once_the_write_lands(
        tmp_path, sim_host, start_daemon):
    """The writer is busy: an apply is blocked inside its knob write (we hold the simulated
    device's lock, as a slow driver call would) when a fatal Xid arrives. Restoring now would
    run under the write in flight, which would land after it; the rollback is queued instead and
    the change is undone once the write is done."""
    from tuner.sim.events import queue_xid
    from tuner.sim.state import SimState

    cfg = write_config(tmp_path / "config.toml", sim_host, tmp_path)
    d = start_daemon(cfg)
    d.wait_ready()
    assert d.call("apply", profile=str(write_profile(tmp_path / "a.yaml", 600)), probation_s=0.3)["ok"]
    b = tmp_path / "b.yaml"
    b.write_text("name: b\nknobs:\n  gpu1.power_limit_w: 650\n")
    result: dict = {}
    state = SimState(sim_host)
    with state.edit() as st:  # every device write now waits for us
        t = threading.Thread(target=lambda: result.update(d.call("apply", profile=str(b), probation_s=1.0)))
        t.start()
        wait_for(lambda: any(t["state"] == "intent" for t in open_txns(tmp_path / "state")),
                 what="the apply's intent (its write blocked on the device)")
        queue_xid(state, st, 1, 79)  # the GPU it is writing to falls off the bus
        time.sleep(1.5)  # several health ticks while the write is still in flight
    t.join(timeout=60)
    assert not result.get("ok"), result  # the apply ends in the rollback, not confirmed
    wait_for(lambda: power_limit_w(sim_host, 1) == 700, what="gpu1 back at its baseline")
    time.sleep(1.0)
    assert power_limit_w(sim_host, 1) == 700  # and stays there: no late write after the restore
    xid = [i for i in incidents(tmp_path / "state") if i["xid"] == 79]
    assert xid and (xid[0]["action"] or "").startswith("rolled back"), xid
    st = d.call("status")["result"]
    assert st["pending"] is None and st["current"]["gpu1.power_limit_w"] == 700
    assert d.stop() == 0


@pytest.fixture
def daemon_in_process(tmp_path, sim_host, monkeypatch):
    """The daemon's own object on the simulated host, its loop driven by the test (one health
    tick at a time), so the writer can be held exactly when the incident arrives."""
    from tuner.ops.settings import NO_DAEMON_ENV
    from tuner.daemon.config import load
    from tuner.daemon.service import Daemon

    cfg_path = write_config(tmp_path / "config.toml", sim_host, tmp_path)
    monkeypatch.setenv(NO_DAEMON_ENV, "1")
    made = []

    def make() -> Daemon:
        d = Daemon(load(cfg_path), cfg_path)
        d.cfg.state_dir.mkdir(parents=True, exist_ok=True)
        d._startup()
        made.append(d)
        return d

    yield make
    for d in made:
        for m in d.monitors:
            getattr(m, "close", lambda: None)()
        if d.host is not None:
            d.host.close()


def test_a_rollback_deferred_by_a_busy_writer_is_retried_until_done(tmp_path, sim_host, daemon_in_process):
    from tuner.sim.inject import inject

    d = daemon_in_process()
    res = d._call("apply", profile=str(write_profile(tmp_path / "a.yaml", 600)), probation_s=0.2)
    txn_a = res["transaction"]
    d._health_tick()
    assert power_limit_w(sim_host) == 600

    held, release = threading.Event(), threading.Event()

    def another_write() -> None:  # a socket request holding the writer (a long apply, a search start)
        with d.writer:
            held.set()
            release.wait(30)

    t = threading.Thread(target=another_write)
    t.start()
    held.wait(5)
    inject(sim_host, "xid", ["79"])
    for _ in range(3):  # the writer stays busy over several ticks: the rollback waits, queued
        d._health_tick()
    assert power_limit_w(sim_host) == 600
    inc = [i for i in incidents(tmp_path / "state") if i["xid"] == 79]
    assert len(inc) == 1 and inc[0]["txn_id"] == txn_a and inc[0]["action"] == "rollback pending"
    release.set()
    t.join()
    d._health_tick()  # the writer is free: the queued rollback runs
    assert power_limit_w(sim_host) == 700
    inc = [i for i in incidents(tmp_path / "state") if i["xid"] == 79]
    assert len(inc) == 1 and (inc[0]["action"] or "").startswith("rolled back to baseline"), inc
    assert not d.incidents.pending


def test_a_queued_rollback_survives_a_restart(tmp_path, sim_host, daemon_in_process):
    """The queue is the journal: a daemon that dies with a rollback still waiting does it when
    it starts again."""
    from tuner.sim.inject import inject

    d = daemon_in_process()
    d._call("apply", profile=str(write_profile(tmp_path / "a.yaml", 600)), probation_s=0.2)
    d._health_tick()
    held, release = threading.Event(), threading.Event()
    t = threading.Thread(target=lambda: (d.writer.acquire(), held.set(), release.wait(30), d.writer.release()))
    t.start()
    held.wait(5)
    inject(sim_host, "xid", ["79"])
    d._health_tick()  # queued: the writer is busy; then the daemon dies before it is free
    assert power_limit_w(sim_host) == 600
    assert [i["action"] for i in incidents(tmp_path / "state") if i["xid"] == 79] == ["rollback pending"]
    d2 = daemon_in_process()  # the next start
    d2._health_tick()
    assert power_limit_w(sim_host) == 700
    release.set()
    t.join()
    assert [(i["action"] or "")[:22] for i in incidents(tmp_path / "state") if i["xid"] == 79] == \
        ["rolled back to baselin"]


def test_an_incident_the_full_journal_cannot_take_is_kept_and_handled_once_it_can(
        tmp_path, sim_host, daemon_in_process):
    """A full state dir (a real tmpfs, filled): the fatal Xid cannot be journalled, so nothing
    may be written either (intent before write); the daemon keeps the incident and handles it
    when the journal takes writes again, instead of dropping what its monitor reported once."""
    import subprocess

    from tuner.sim.inject import inject

    state = tmp_path / "state"
    state.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(state)],
                      capture_output=True).returncode:
        pytest.skip("needs mount (a tmpfs of a given size)")
    try:
        d = daemon_in_process()
        d._call("apply", profile=str(write_profile(tmp_path / "a.yaml", 600)), probation_s=0.2)
        d._health_tick()
        with open(state / "filler", "wb") as f:
            try:
                while True:
                    f.write(b"\0" * (1 << 16))
                    f.flush()
            except OSError:
                pass
        inject(sim_host, "xid", ["79"])
        d._health_tick()
        d._health_tick()
        assert d.incidents.unrecorded and power_limit_w(sim_host) == 600  # kept; nothing written unjournalled
        os.unlink(state / "filler")
        d._health_tick()
        assert power_limit_w(sim_host) == 700 and not d.incidents.unrecorded
        xid = [i for i in incidents(state) if i["xid"] == 79]
        assert len(xid) == 1 and (xid[0]["action"] or "").startswith("rolled back to baseline"), xid
    finally:
        subprocess.run(["umount", "-l", str(state)], capture_output=True)
