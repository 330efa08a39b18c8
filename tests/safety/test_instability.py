"""Instability on the simulated host: each injected fault rolls the transaction back within 2 s
of the injection (measured until the sim's state is restored) and quarantines the candidate."""
from __future__ import annotations

import time

import pytest

pytest.importorskip("tuner.sim.inject")

from safety import Instability, Journal, Policy, Quarantined, Transaction  # noqa: E402
from safety import monitors as mon  # noqa: E402
from tuner.host import open_host  # noqa: E402
from tuner.knobs.registry import discover  # noqa: E402
from tuner.sim.hostinit import init_host  # noqa: E402
from tuner.sim.inject import inject  # noqa: E402
from tuner.sim.workload import SimWorkload  # noqa: E402

CHANGE = {"gpu0.power_limit_w": 600, "gpu0.locked_clocks_mhz": [1500, 1500]}
POLICY = Policy.from_dict({"rules": [{"knob": "gpu*"}]}, "test")


@pytest.fixture
def sim(tmp_path):
    root = init_host(tmp_path / "host")
    host = open_host("sim", root)
    yield root, host, discover(host, providers=["gpu"])
    host.close()


def _restored(knobs) -> bool:
    return knobs["gpu0.power_limit_w"].read() == 700 and knobs["gpu0.locked_clocks_mhz"].read() is None


@pytest.mark.parametrize("event,args,reason,kind", [
    ("xid", ["79"], "instability_xid", "xid"),
    ("xid", ["48"], "instability_xid", "xid"),
    ("xid", ["119"], "instability_xid", "xid"),
    ("ecc-dbe", [], "instability_ecc", "ecc_dbe"),
    ("thermal", [], "instability_thermal", "thermal"),
    ("pcie-replay", ["100"], "instability_pcie", "pcie_replay"),
    ("aer-fatal", [], "instability_pcie", "aer"),
    ("hang", [], "instability_hang", "canary_hang"),
])
def test_injected_fault_rolls_back_within_2s_and_quarantines(sim, tmp_path, event, args, reason, kind):
    root, host, knobs = sim
    wl = SimWorkload(root)
    canary = mon.CanaryMonitor(lambda: wl.canary(timeout_s=20), expected=True, timeout_s=0.5,
                               interval_s=0.1, mode="process")
    monitors = mon.standard(nvml=host.nvml, root=root, canary=canary)
    j = Journal(tmp_path / "state" / "journal.db")
    t = Transaction(j, knobs, CHANGE, policy=POLICY, monitors=monitors, probation_s=60,
                    key=f"cand-{event}")
    t.begin()
    assert knobs["gpu0.power_limit_w"].read() == 600
    time.sleep(0.3)  # a healthy probation: no incident, nothing rolled back
    assert t.check() == [] and j.txn_state(t.id) == "probation"

    t0 = time.perf_counter()
    inject(root, event, args)
    while not _restored(knobs):
        assert time.perf_counter() - t0 < 2.0, f"not restored 2 s after {event}"
        time.sleep(0.005)
    dt = time.perf_counter() - t0
    with pytest.raises(Instability) as e:
        t.check()
    inc = e.value.incident
    assert inc.reason == reason and inc.type == kind and inc.fatal
    row = j.txn(t.id)
    assert row["state"] == "rolled_back" and row["reason"].startswith(reason)
    assert j.is_quarantined(f"cand-{event}")["txn_id"] == t.id
    logged = j.incidents(txn_id=t.id)
    assert any(i["type"] == kind and i["severity"] == "fatal" for i in logged)
    assert all(i["knob"] == "gpu0.power_limit_w,gpu0.locked_clocks_mhz" for i in logged)
    with pytest.raises(Quarantined):
        Transaction(j, knobs, CHANGE, policy=POLICY, key=f"cand-{event}").begin()
    print(f"\n{event} {' '.join(args)}: restored {dt * 1000:.0f} ms after injection")


def test_warnings_do_not_roll_back(sim, tmp_path):
    root, host, knobs = sim
    j = Journal(tmp_path / "state" / "journal.db")
    with Transaction(j, knobs, CHANGE, policy=POLICY, monitors=mon.standard(host.nvml, root),
                     probation_s=60, poll_interval_s=None) as t:
        inject(root, "xid", ["13"])  # usually the application: recorded only
        inject(root, "xid", ["94"])  # contained ECC error: a warning
        inject(root, "ecc-sbe", ["3"])
        inject(root, "aer-correctable", [])
        inc = t.check()
        assert sorted({(i.type, i.xid, i.severity) for i in inc}, key=str) == sorted(
            {("xid", 13, "info"), ("xid", 94, "warning"), ("ecc_sbe", None, "warning"),
             ("aer", None, "warning")}, key=str)
        t.confirm()
    assert knobs["gpu0.power_limit_w"].read() == 600


def test_incidents_before_the_change_are_not_blamed_on_it(sim, tmp_path):
    root, host, knobs = sim
    inject(root, "xid", ["79"])
    inject(root, "ecc-dbe", [])
    j = Journal(tmp_path / "state" / "journal.db")
    with Transaction(j, knobs, CHANGE, policy=POLICY, monitors=mon.standard(host.nvml, root),
                     probation_s=60, poll_interval_s=None) as t:
        assert t.check() == []
        t.confirm()
