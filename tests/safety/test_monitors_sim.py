"""Each NVML / sysfs monitor on its own against the simulated host's fake NVML and files."""
from __future__ import annotations

import pytest

pytest.importorskip("tuner.sim.inject")

from safety import monitors as mon  # noqa: E402
from tuner.host import open_host  # noqa: E402
from tuner.sim.hostinit import init_host  # noqa: E402
from tuner.sim.inject import inject  # noqa: E402


@pytest.fixture
def sim(tmp_path):
    root = init_host(tmp_path / "host", gpus=2)
    host = open_host("sim", root)
    yield root, host.nvml
    host.close()


def kinds(incs):
    return sorted((i.type, i.severity, i.xid, i.gpu) for i in incs)


def test_nvml_xid_events_per_gpu_and_classified(sim):
    root, nv = sim
    m = mon.NvmlXidMonitor(nv)
    inject(root, "xid", ["79"])  # before arm: not this change's fault
    m.arm()
    assert set(m.registered) == {0, 1}
    assert m.poll() == []
    inject(root, "xid", ["79"], gpu=1)
    inject(root, "xid", ["31"])
    inject(root, "xid", ["94"])
    assert kinds(m.poll()) == [("xid", "fatal", 79, "1"), ("xid", "info", 31, "0"),
                               ("xid", "warning", 94, "0")]
    assert m.poll() == []
    m.close()


def test_kmsg_monitor_on_the_sim_log(sim):
    root, _ = sim
    m = mon.KmsgXidMonitor(root)
    m.arm()
    inject(root, "xid", ["119"])
    [inc] = m.poll()
    assert (inc.xid, inc.severity) == (119, "fatal") and inc.gpu.startswith("0000:")


def test_ecc_counters_and_remapped_rows(sim):
    root, nv = sim
    m = mon.EccMonitor(nv)
    m.arm()
    inject(root, "ecc-sbe", ["2"])
    assert kinds(m.poll()) == [("ecc_sbe", "warning", None, "0")]
    inject(root, "ecc-dbe", [], gpu=1)
    got = kinds(m.poll())
    assert ("ecc_dbe", "fatal", None, "1") in got and ("remapped_rows", "fatal", None, "1") in got
    assert m.poll() == []


def test_pcie_replay_rate_against_dcgm_threshold(sim):
    root, nv = sim
    m = mon.PcieReplayMonitor(nv)
    m.arm()
    inject(root, "pcie-replay", ["20"])
    assert m.poll() == []  # 20 in the last minute: under 31/min
    inject(root, "pcie-replay", ["15"])
    [inc] = m.poll()  # 35 in the last minute
    assert inc.type == "pcie_replay" and inc.fatal and inc.data["replays"] == 35


def test_aer_fatal_and_nonfatal_on_the_sim(sim):
    root, _ = sim
    m = mon.AerMonitor(root)
    m.arm()
    assert len(m.bdfs()) == 2
    inject(root, "aer-nonfatal", [], gpu=1)
    [inc] = m.poll()
    assert inc.fatal and inc.data["kind"] == "nonfatal"


def test_clock_events_and_temperature(sim):
    root, nv = sim
    ce, th = mon.ClockEventMonitor(nv), mon.ThermalMonitor(nv)
    ce.arm(), th.arm()
    inject(root, "power-brake", [])
    [inc] = ce.poll()
    assert inc.type == "clock_event" and "power brake" in inc.detail and inc.fatal
    assert th.poll() == []
    inject(root, "thermal", [], gpu=1)
    [inc] = ce.poll()
    assert inc.type == "thermal" and inc.gpu == "1"
    [inc] = th.poll()
    assert inc.type == "thermal" and inc.data["temp_c"] >= inc.data["slowdown_c"] == 87
    assert ce.poll() == [] and th.poll() == []  # edge-triggered: once per episode


def test_standard_set_on_a_vm_host(tmp_path):
    root = init_host(tmp_path / "vm", vm=True)
    host = open_host("sim", root)
    ms = mon.standard(host.nvml, root)
    for m in ms:  # every monitor arms and polls on a VM (no AER files, read-only host)
        m.arm()
        assert m.poll() == []
    host.close()


def test_a_throttling_incumbent_is_not_blamed_on_the_change(sim):
    root, nv = sim
    inject(root, "thermal", [])  # already hot when the change starts
    ce, th = mon.ClockEventMonitor(nv), mon.ThermalMonitor(nv)
    ce.arm(), th.arm()
    assert ce.poll() == [] and th.poll() == []
    inject(root, "clear", [])
    assert ce.poll() == [] and th.poll() == []
    inject(root, "thermal", [])  # back to the incumbent's state (an A/B switch): still not new
    assert ce.poll() == [] and th.poll() == []
    inject(root, "power-brake", [])  # but a new kind of slowdown is
    assert [i.type for i in ce.poll()] == ["clock_event"]
