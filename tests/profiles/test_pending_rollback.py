"""Pending knobs (BIOS through Redfish, the driver option in modprobe.d) under the safety
Transaction: staged, journalled, and rolled back by clearing the pending setting."""
from __future__ import annotations

import json
import time

import pytest

from safety import Journal, Policy, Transaction
from safety.errors import PolicyDenied
from safety.protocol import PendingKnob
from tests.profiles import simhost
from tuner.knobs import registry
from tuner.sim.hostinit import init_host

PERMISSIVE = {"version": 1, "forbidden": [], "rules": [
    {"knob": "bios.*", "allow_reboot_effect": True}, {"knob": "driver.*", "allow_reboot_effect": True},
    {"knob": "os.*"}]}
DRV = "driver.nvidia.NVreg_EnablePCIERelaxedOrderingMode"


@pytest.fixture
def host(tmp_path):
    root = init_host(tmp_path / "h", "h200")
    return root, registry.discover(simhost.host(root))


def test_bios_and_driver_knobs_satisfy_the_pending_protocol(host):
    _, knobs = host
    assert isinstance(knobs["bios.ProcCStates"], PendingKnob)
    assert isinstance(knobs[DRV], PendingKnob)


def test_rollback_clears_pending_bios_and_driver_changes(host, tmp_path):
    root, knobs = host
    j = Journal(tmp_path / "state" / "journal.db")
    txn = Transaction(j, knobs, {"bios.ProcCStates": "Disabled", DRV: 1, "os.numa_balancing": 0},
                      policy=Policy.from_dict(PERMISSIVE), probation_s=30, watchdog="thread")
    txn.begin()
    assert json.loads((root / "bmc/state.json").read_text())["pending"] == {"ProcCStates": "Disabled"}
    assert knobs[DRV].pending() == 1
    res = txn.rollback("test")
    assert res["state"] == "rolled_back", res
    assert json.loads((root / "bmc/state.json").read_text())["pending"] == {}
    assert knobs[DRV].pending() is None
    assert not (root / "etc/modprobe.d/99-metaltune-nvidia.conf").exists()
    assert knobs["os.numa_balancing"].read() == 1
    assert knobs["bios.ProcCStates"].read() == "Enabled"


def test_watchdog_clears_pending_at_the_deadline(host, tmp_path):
    root, knobs = host
    j = Journal(tmp_path / "state" / "journal.db")
    txn = Transaction(j, knobs, {"bios.WorkloadProfile": "LowLatency"},
                      policy=Policy.from_dict(PERMISSIVE), probation_s=0.3, watchdog="thread")
    txn.begin()
    for _ in range(100):
        if j.txn_state(txn.id) == "rolled_back":
            break
        time.sleep(0.05)
    assert j.txn_state(txn.id) == "rolled_back"
    assert json.loads((root / "bmc/state.json").read_text())["pending"] == {}


def test_default_policy_never_stages_bios(host, tmp_path):
    root, knobs = host
    j = Journal(tmp_path / "state" / "journal.db")
    with pytest.raises(PolicyDenied, match="bios"):
        Transaction(j, knobs, {"bios.ProcCStates": "Disabled"}, watchdog="thread").begin()
    assert json.loads((root / "bmc/state.json").read_text())["pending"] == {}
