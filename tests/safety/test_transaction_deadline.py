"""The deadline covers the measurement (issue 29: a 47 s A/B was rolled back by a 30 s grace):
a transaction that writes nothing has no journal deadline and no watchdog; a caller that keeps
checking (keepalive_s) keeps its change past the probation; one that stops checking (a hang) is
still rolled back by the real watchdog process."""
from __future__ import annotations

import time

from safety import ProbationExpired, Transaction

from tests.safety.test_transaction import wait_state


def test_a_transaction_that_writes_nothing_has_no_deadline_and_no_watchdog(fhost, journal, policy, state):
    _, knobs = fhost
    t = Transaction(journal, knobs, {"gpu0.power_limit_w": knobs["gpu0.power_limit_w"].read()},
                    policy=policy, state_dir=state, probation_s=0.2).begin()
    row = journal.txn(t.id)
    assert row["state"] == "probation" and row["deadline"] is None and not row["watchdog_pid"]
    time.sleep(0.6)  # three probations: nothing expires it
    t.check()
    t.confirm()
    assert journal.txn(t.id)["state"] == "confirmed"


def test_checks_keep_a_change_alive_past_its_probation_and_a_silent_caller_is_rolled_back(
        fhost, journal, policy, state):
    _, knobs = fhost
    t = Transaction(journal, knobs, {"gpu0.power_limit_w": 500}, policy=policy, state_dir=state,
                    probation_s=0.3, keepalive_s=0.8).begin()
    assert journal.txn(t.id)["watchdog_pid"]
    end = time.monotonic() + 2.5  # eight probations, three keepalives
    while time.monotonic() < end:
        t.check()  # the measurement goes on: each sample's check moves the deadline
        time.sleep(0.1)
    assert journal.txn(t.id)["deadline"] > time.time()
    t.confirm()
    assert journal.txn(t.id)["state"] == "confirmed" and knobs["gpu0.power_limit_w"].read() == 500

    t2 = Transaction(journal, knobs, {"gpu0.power_limit_w": 450}, policy=policy, state_dir=state,
                     probation_s=0.3, keepalive_s=0.8).begin()
    assert wait_state(journal, t2.id, timeout=5) == "rolled_back"  # no check: the watchdog acts
    assert knobs["gpu0.power_limit_w"].read() == 500
    try:
        t2.check()
        raise AssertionError("expected ProbationExpired")
    except ProbationExpired:
        pass
