"""Transaction behaviour on file-backed knobs: write-ahead journal, read back, confirm, rollback
in reverse order, watchdog deadline (forked and spawned), caller death, lock, quarantine."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from safety import (ApplyFailed, Busy, Instability, PolicyDenied, ProbationExpired,
                    Quarantined, Transaction, WriterLock)
from safety.monitors.base import Monitor
from tests.safety import _knobs

REPO = Path(__file__).resolve().parents[2]


def wait_state(journal, txn_id, timeout=5.0):
    end = time.monotonic() + timeout
    while (st := journal.txn_state(txn_id)) not in ("rolled_back", "confirmed", "rollback_failed"):
        if time.monotonic() > end:
            break
        time.sleep(0.01)
    return st


def txn(journal, knobs, changes, policy, state, **kw):
    kw.setdefault("probation_s", 30)
    return Transaction(journal, knobs, changes, policy=policy, state_dir=state, **kw)


def test_confirm_keeps_change_and_journals_every_step(fhost, journal, policy, state):
    root, knobs = fhost
    with txn(journal, knobs, {"gpu0.power_limit_w": 500, "gpu0.locked_clocks_mhz": 1500},
             policy, state, label="trial 1") as t:
        assert knobs["gpu0.power_limit_w"].read() == 500
        row = journal.txn(t.id)
        assert row["state"] == "probation" and row["label"] == "trial 1"
        assert row["watchdog_pid"] and row["deadline"] > time.time() + 25
        assert [c["state"] for c in journal.changes(t.id)] == ["applied", "applied"]
        t.confirm()
    assert journal.txn(t.id)["state"] == "confirmed"
    assert [(c["knob"], c["before"], c["after"], c["state"]) for c in journal.changes(t.id)] == [
        ("gpu0.power_limit_w", 700, 500, "confirmed"),
        ("gpu0.locked_clocks_mhz", 0, 1500, "confirmed")]
    assert journal.baseline()["gpu0.power_limit_w"]["value"] == 700
    assert knobs["gpu0.power_limit_w"].read() == 500
    # the watchdog has exited and the lock is free again
    with pytest.raises(ChildProcessError):
        os.waitpid(journal.txn(t.id)["watchdog_pid"], os.WNOHANG)
    WriterLock(state).acquire().release()


def test_baseline_is_the_value_before_the_first_change_only(fhost, journal, policy, state):
    _, knobs = fhost
    for v in (600, 500):
        with txn(journal, knobs, {"gpu0.power_limit_w": v}, policy, state) as t:
            t.confirm()
    b = journal.baseline()["gpu0.power_limit_w"]
    assert b["value"] == 700 and b["identity"] == knobs["gpu0.power_limit_w"].identity()


def test_leaving_without_confirm_or_raising_rolls_back_in_reverse(fhost, journal, policy, state):
    root, knobs = fhost
    order = []
    for k in knobs.values():
        orig = k.apply
        k.apply = (lambda orig, n: lambda v: (order.append((n, v)), orig(v))[1])(orig, k.name)
    with pytest.raises(RuntimeError):
        with txn(journal, knobs, {"gpu0.power_limit_w": 500, "gpu0.locked_clocks_mhz": 1500},
                 policy, state) as t:
            raise RuntimeError("benchmark crashed")
    assert order == [("gpu0.power_limit_w", 500), ("gpu0.locked_clocks_mhz", 1500),
                     ("gpu0.locked_clocks_mhz", 0), ("gpu0.power_limit_w", 700)]
    row = journal.txn(t.id)
    assert row["state"] == "rolled_back" and "benchmark crashed" in row["reason"]
    with txn(journal, knobs, {"gpu0.power_limit_w": 500}, policy, state) as t2:
        pass
    assert journal.txn(t2.id)["reason"] == "left without confirm"
    assert knobs["gpu0.power_limit_w"].read() == 700


def test_readback_failure_rolls_back_what_was_applied(fhost, journal, policy, state):
    root, knobs = fhost
    knobs["gpu0.locked_clocks_mhz"].fail_write = True  # next write is v+1: read-back disagrees
    with pytest.raises(ApplyFailed, match="read back"):
        txn(journal, knobs, {"gpu0.power_limit_w": 500, "gpu0.locked_clocks_mhz": 1500},
            policy, state).begin()
    assert knobs["gpu0.power_limit_w"].read() == 700
    assert knobs["gpu0.locked_clocks_mhz"].read() == 0
    t = journal.txns(1)[0]
    assert t["state"] == "rolled_back" and t["reason"].startswith("apply_failed")


def test_policy_refusal_writes_nothing_and_names_the_rule(fhost, journal, policy, state):
    root, knobs = fhost
    before = _knobs.snapshot(root)
    with pytest.raises(PolicyDenied) as e:
        txn(journal, knobs, {"gpu0.power_limit_w": 350}, policy, state).begin()
    assert "test-policy.yaml" in str(e.value) and "rule #0" in str(e.value)
    assert "max_step 300" in str(e.value)
    with pytest.raises(PolicyDenied, match=r"forbidden 'cpu\.\*'"):
        txn(journal, knobs, {"cpu.governor_level": 3}, policy, state).begin()
    assert _knobs.snapshot(root) == before
    assert journal.txns() == [] and journal.baseline() == {}
    assert all(k.writes == 0 for k in knobs.values())


def test_pending_knob_rolls_back_by_clearing_pending(fhost, journal, policy, state):
    root, knobs = fhost
    bios = knobs["bios.Profile"]
    with txn(journal, knobs, {"bios.Profile": 4}, policy, state) as t:
        assert bios.pending() == 4 and bios.read() == 0
    assert bios.pending() is None and bios.read() == 0
    assert journal.changes(t.id)[0]["state"] == "rolled_back"


def test_forked_watchdog_rolls_back_at_deadline_while_caller_sleeps(fhost, journal, policy, state):
    _, knobs = fhost
    t = txn(journal, knobs, {"gpu0.power_limit_w": 450}, policy, state, probation_s=0.3).begin()
    t0 = time.time()
    while knobs["gpu0.power_limit_w"].read() != 700:
        assert time.time() - t0 < 3
        time.sleep(0.01)
    assert wait_state(journal, t.id) == "rolled_back"
    assert "probation_expired" in journal.txn(t.id)["reason"]
    with pytest.raises(ProbationExpired):
        t.confirm()


def _child(script: str, state: Path, root: Path, **env: str) -> subprocess.Popen:
    code = textwrap.dedent(f"""
        import sys, time, os
        from safety import Journal, Transaction, Policy
        from tests.safety import _knobs
        knobs = _knobs.make({str(root)!r})
        j = Journal({str(state / 'journal.db')!r})
        pol = Policy.from_dict({{"rules": [{{"knob": "gpu0.*"}}]}})
    """) + textwrap.dedent(script)
    return subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE,
                            env={**os.environ, **env, "PYTHONPATH": str(REPO)})


@pytest.mark.parametrize("mode", ["fork", "spawn"])
def test_caller_killed_in_probation_watchdog_restores_at_once(fhost, state, mode):
    root, knobs = fhost
    factory = f"knob_factory=('tests.safety._knobs:make', {{'root': {str(root)!r}}})," \
        if mode == "spawn" else ""
    p = _child(f"""
        t = Transaction(j, knobs, {{"gpu0.power_limit_w": 400, "gpu0.locked_clocks_mhz": 900}},
                        policy=pol, probation_s=60, state_dir={str(state)!r}, {factory}).begin()
        print("applied", flush=True)
        time.sleep(120)
    """, state, root)
    assert p.stdout.readline().strip() == b"applied"
    assert knobs["gpu0.power_limit_w"].read() == 400
    t0 = time.monotonic()
    p.send_signal(signal.SIGKILL)
    p.wait()
    while knobs["gpu0.power_limit_w"].read() != 700 or knobs["gpu0.locked_clocks_mhz"].read() != 0:
        assert time.monotonic() - t0 < 10, "watchdog did not restore after the caller died"
        time.sleep(0.01)
    from safety import Journal
    j = Journal(state / "journal.db")
    tid = j.txns(1)[0]["id"]
    assert wait_state(j, tid, timeout=15) == "rolled_back", j.txn(tid)
    assert "died" in j.txn(tid)["reason"], j.txn(tid)
    # the lock is released once the watchdog is done
    WriterLock(state).acquire(timeout=15).release()


def test_spawned_watchdog_survives_a_caller_hung_holding_the_gil(fhost, state):
    root, knobs = fhost
    p = _child(f"""
        t = Transaction(j, knobs, {{"gpu0.power_limit_w": 400}}, policy=pol, probation_s=0.5,
                        state_dir={str(state)!r},
                        knob_factory=('tests.safety._knobs:make', {{'root': {str(root)!r}}})).begin()
        print("applied", flush=True)
        import re
        re.match(r"(a+)+$", "a" * 40 + "b")   # minutes in C with the GIL held
    """, state, root)
    assert p.stdout.readline().strip() == b"applied"
    t0 = time.monotonic()
    try:
        while knobs["gpu0.power_limit_w"].read() != 700:
            assert time.monotonic() - t0 < 5
            time.sleep(0.02)
        assert p.poll() is None  # the caller is still hung
    finally:
        p.kill()
        p.wait()


def test_one_writer_per_host(fhost, journal, policy, state):
    _, knobs = fhost
    p = _child(f"""
        from safety import WriterLock
        WriterLock({str(state)!r}).acquire()
        print("locked", flush=True)
        time.sleep(60)
    """, state, fhost[0])
    try:
        assert p.stdout.readline().strip() == b"locked"
        with pytest.raises(Busy, match=f"pid {p.pid}"):
            txn(journal, knobs, {"gpu0.power_limit_w": 500}, policy, state,
                lock_timeout_s=0.2).begin()
        assert knobs["gpu0.power_limit_w"].read() == 700
    finally:
        p.kill()
        p.wait()
    # the lock died with its process
    with txn(journal, knobs, {"gpu0.power_limit_w": 500}, policy, state) as t:
        t.confirm()


class FlagMonitor(Monitor):
    name = "flag"

    def __init__(self, severity="fatal"):
        self.fire_at = None
        self.severity = severity

    def poll(self):
        if self.fire_at is not None:
            self.fire_at = None
            return [self.incident("xid", self.severity, "Xid 79 (test)", xid=79)]
        return []


def test_fatal_incident_rolls_back_quarantines_and_refuses_again(fhost, journal, policy, state):
    _, knobs = fhost
    m = FlagMonitor()
    t = txn(journal, knobs, {"gpu0.power_limit_w": 450}, policy, state, monitors=[m],
            key="cand-A").begin()
    t0 = time.monotonic()
    m.fire_at = t0
    while knobs["gpu0.power_limit_w"].read() != 700:  # the monitor thread acts on its own
        assert time.monotonic() - t0 < 2
        time.sleep(0.005)
    with pytest.raises(Instability) as e:
        t.check()
    assert e.value.incident.xid == 79 and e.value.incident.reason == "instability_xid"
    inc = journal.incidents(txn_id=t.id)
    assert inc[0]["xid"] == 79 and inc[0]["knob"] == "gpu0.power_limit_w"
    assert journal.is_quarantined("cand-A")["txn_id"] == t.id
    assert journal.txn(t.id)["reason"].startswith("instability_xid")
    with pytest.raises(Quarantined):
        txn(journal, knobs, {"gpu0.power_limit_w": 450}, policy, state, key="cand-A").begin()


def test_warning_incident_is_recorded_not_rolled_back(fhost, journal, policy, state):
    _, knobs = fhost
    m = FlagMonitor("warning")
    with txn(journal, knobs, {"gpu0.power_limit_w": 450}, policy, state, monitors=[m],
             poll_interval_s=None) as t:
        m.fire_at = 1
        assert [i.severity for i in t.check()] == ["warning"]
        t.confirm()
    assert knobs["gpu0.power_limit_w"].read() == 450
    assert journal.incidents()[0]["severity"] == "warning"


def test_values_already_in_force_are_not_written_or_journalled(fhost, journal, policy, state):
    _, knobs = fhost
    with txn(journal, knobs, {"gpu0.power_limit_w": 700, "gpu0.locked_clocks_mhz": 900,
                              "cpu.governor_level": 0}, policy, state) as t:
        t.confirm()
    # cpu.* is forbidden, but asking for the value it already has changes nothing
    assert t.unchanged == ["gpu0.power_limit_w", "cpu.governor_level"]
    assert [c["knob"] for c in journal.changes(t.id)] == ["gpu0.locked_clocks_mhz"]
    assert knobs["gpu0.power_limit_w"].writes == 0 and knobs["cpu.governor_level"].writes == 0


def test_safety_imports_nothing_from_tuner():
    code = ("import sys, safety, safety.transaction, safety.policy, safety.monitors, safety.recovery,"
            " safety.watchdog; bad = [m for m in sys.modules if m.split('.')[0] in"
            " ('tuner', 'kernelsearch', 'torch', 'triton')]; print(bad); sys.exit(bool(bad))")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_journal_is_a_rollback_journal_with_full_sync(journal):
    """Not WAL: a forked watchdog must not share WAL's shared-memory index (safety/journal.py)."""
    c = journal._conn()
    assert c.execute("PRAGMA journal_mode").fetchone()[0] == "truncate"
    assert c.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL


def test_recover_never_writes_a_knob_whose_device_changed(fhost, journal, policy, state):
    from safety import recover

    _, knobs = fhost
    t = txn(journal, knobs, {"gpu0.power_limit_w": 500}, policy, state, watchdog="none").begin()
    t._lock.release()  # as if the process had died: the journal still says "probation"
    k = knobs["gpu0.power_limit_w"]
    k.identity = lambda: "GPU-another-card"  # the GPU at this index was swapped
    res = recover(journal, knobs, state_dir=state)
    assert not res["ok"] and "identity changed" in res["recovered"][0]["failed"][0]["error"]
    assert k.read() == 500 and k.writes == 1
    assert journal.txn(t.id)["state"] == "rollback_failed"
    del k.identity
    assert recover(journal, knobs, state_dir=state)["ok"] and k.read() == 700


def test_zero_probation_confirms_at_once_and_journal_is_private(fhost, journal, policy, state):
    _, knobs = fhost
    with txn(journal, knobs, {"gpu0.power_limit_w": 650}, policy, state, probation_s=0) as t:
        time.sleep(0.05)
        t.confirm()
    assert journal.txn(t.id)["state"] == "confirmed" and knobs["gpu0.power_limit_w"].read() == 650
    assert (journal.path.stat().st_mode & 0o777) == 0o600
