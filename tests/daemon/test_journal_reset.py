"""A journal reset under a running daemon (issue 29, "a reset leaves the daemon blind"), through
the real daemon process on a simulated host: journal.db is deleted, `recover --from-defaults` is
asked of the daemon, a change is applied after it; a fatal Xid must then be journalled in the new
journal and roll that change back. And with the journal gone and no reset, a fatal incident
still rolls the host back (to the driver defaults) instead of being retried forever."""
from __future__ import annotations

import os

import pytest

from tests.daemon.conftest import base_env, metaltune, power_limit_w, write_config, write_profile
from tests.daemon.test_incident_rollback import incidents, wait_for

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the daemon's socket is root-only")


def test_after_a_reset_through_the_daemon_an_incident_rolls_back_the_new_change(
        tmp_path, sim_host, start_daemon):
    state = tmp_path / "state"
    d = start_daemon(write_config(tmp_path / "config.toml", sim_host, tmp_path))
    d.wait_ready()
    assert d.call("apply", profile=str(write_profile(tmp_path / "a.yaml", 600)), probation_s=0.3)["ok"]
    os.unlink(state / "journal.db")  # a careless `rm`, or a restore gone wrong
    r = d.call("recover", from_defaults=True)
    assert r["ok"], r
    assert power_limit_w(sim_host) == 700

    r = d.call("apply", profile=str(write_profile(tmp_path / "b.yaml", 650)), probation_s=0.3)
    assert r["ok"], r
    txn = r["result"]["transaction"]
    assert power_limit_w(sim_host) == 650
    metaltune("sim", "inject", str(sim_host), "xid", "79", env=base_env(tmp_path / "run"))
    wait_for(lambda: power_limit_w(sim_host) == 700, timeout=30, what="the rollback")
    # the incident is journalled "rollback pending" first and its action updated once the
    # rollback is recorded, which can land just after the power limit is read back
    xid = wait_for(lambda: [i for i in incidents(state) if i["xid"] == 79
                            and (i["action"] or "").startswith("rolled back")],
                   what="the incident journalled in the new journal, rolled back")
    assert xid[0]["txn_id"] == txn and xid[0]["action"].startswith("rolled back"), xid
    assert "StateUnwritable" not in d.log()
    assert d.stop() == 0


def test_with_the_journal_gone_a_fatal_incident_still_rolls_back(tmp_path, sim_host, start_daemon):
    state = tmp_path / "state"
    d = start_daemon(write_config(tmp_path / "config.toml", sim_host, tmp_path))
    d.wait_ready()
    assert d.call("apply", profile=str(write_profile(tmp_path / "a.yaml", 600)), probation_s=0.3)["ok"]
    assert power_limit_w(sim_host) == 600
    os.unlink(state / "journal.db")
    metaltune("sim", "inject", str(sim_host), "xid", "79", env=base_env(tmp_path / "run"))
    wait_for(lambda: power_limit_w(sim_host) == 700, timeout=30, what="the rollback to defaults")
    d.wait_log("event=rollback.defaults")
    # and the incident is journalled, in the journal the reset made
    wait_for(lambda: [i for i in incidents(state) if i["xid"] == 79], what="the incident journalled")
    assert d.stop() == 0
