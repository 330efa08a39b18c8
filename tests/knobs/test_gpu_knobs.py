"""GPU (NVML) knobs on both simulated SKUs: domains from the device, apply with read-back,
out-of-domain and read-only refusals that change nothing, offsets supported or not."""
from __future__ import annotations

import pytest

from tuner.errors import DryRunRefused, OperationFailed, OutOfDomain, ReadbackMismatch
from tuner.host import open_host
from tuner.knobs import gpu as gpuknobs
from tuner.knobs import registry
from tuner.knobs.base import ClockLock, IntRange, Unsupported
from tuner.sim.fake_pynvml import FakeNVML
from tuner.sim.hostinit import init_host
from tuner.sim.state import SimState


def _host(tmp_path, sku="h200", vm=False, gpus=1, dry_run=False, name=None):
    root = init_host(tmp_path / (name or f"{sku}{vm}{gpus}"), sku, vm=vm, gpus=gpus, seed=3,
                     os_tree=False)
    return open_host("sim", root, dry_run=dry_run)


def _knobs(host):
    return registry.discover(host, ["gpu"])


def _gpu_state(host, i=0):
    return SimState(host.root).read()["gpus"][i]


def test_h200_domains_come_from_the_device(tmp_path):
    host = _host(tmp_path)
    k = _knobs(host)
    assert {n.split(".", 1)[1] for n in k} == {
        "power_limit_w", "locked_clocks_mhz", "locked_mem_clocks_mhz", "app_clocks_mhz",
        "gpc_clock_offset_mhz", "mem_clock_offset_mhz", "persistence_mode"}
    pl = k["gpu0.power_limit_w"].limits()
    assert isinstance(pl, IntRange) and (pl.min, pl.max, pl.unit) == (200, 700, "W")
    assert k["gpu0.power_limit_w"].read() == 700 and k["gpu0.power_limit_w"].default() == 700
    lc = k["gpu0.locked_clocks_mhz"].limits()
    assert isinstance(lc, ClockLock) and len(lc.supported) == 110
    assert (min(lc.supported), max(lc.supported)) == (345, 1980)
    assert k["gpu0.locked_mem_clocks_mhz"].limits().supported == [2201, 3201]
    for name in ("gpu0.gpc_clock_offset_mhz", "gpu0.mem_clock_offset_mhz"):
        dom = k[name].limits()
        assert isinstance(dom, Unsupported) and "0..0" in dom.reason
        assert k[name].read() == 0
        with pytest.raises(OutOfDomain, match="not supported"):
            k[name].apply(15)
    assert "DEPRECATED" in k["gpu0.app_clocks_mhz"].description
    assert k["gpu0.app_clocks_mhz"].read() == [1980, 3201]
    assert k["gpu0.persistence_mode"].read() == 1
    uuid = _gpu_state(host)["uuid"]
    assert all(kn.identity() == uuid for kn in k.values())


@pytest.mark.parametrize("sku,clock,power", [("h200", 1770, 600), ("rtx4090", 2400, 410)])
def test_apply_reads_back_and_takes_effect(tmp_path, sku, clock, power):
    host = _host(tmp_path, sku)
    k = _knobs(host)
    assert k["gpu0.power_limit_w"].apply(power) == power
    assert _gpu_state(host)["power_limit_mw"] == power * 1000
    assert k["gpu0.locked_clocks_mhz"].apply(clock) == [clock, clock]
    assert k["gpu0.locked_clocks_mhz"].read() == [clock, clock]
    top = max(k["gpu0.locked_mem_clocks_mhz"].limits().supported)
    assert k["gpu0.locked_mem_clocks_mhz"].apply([top, top]) == [top, top]
    assert _gpu_state(host)["locked_gr"] == [clock, clock]
    assert k["gpu0.persistence_mode"].apply(0) == 0
    assert k["gpu0.locked_clocks_mhz"].apply(None) is None
    assert _gpu_state(host)["locked_gr"] is None
    # a second process (a fresh Host) sees the same values
    k2 = _knobs(open_host("sim", host.root))
    assert k2["gpu0.power_limit_w"].read() == power and k2["gpu0.locked_mem_clocks_mhz"].read() == [top, top]


@pytest.mark.parametrize("sku,name,value", [
    ("h200", "gpu0.power_limit_w", 750), ("h200", "gpu0.power_limit_w", 199),
    ("h200", "gpu0.power_limit_w", 605), ("h200", "gpu0.power_limit_w", "600"),
    ("h200", "gpu0.locked_clocks_mhz", 1985), ("h200", "gpu0.locked_clocks_mhz", [1500, 1200]),
    ("h200", "gpu0.locked_mem_clocks_mhz", [3000, 3000]), ("h200", "gpu0.app_clocks_mhz", [1985, 3201]),
    ("h200", "gpu0.persistence_mode", 2),
    ("rtx4090", "gpu0.power_limit_w", 610), ("rtx4090", "gpu0.locked_clocks_mhz", 3120),
    ("rtx4090", "gpu0.gpc_clock_offset_mhz", -1005), ("rtx4090", "gpu0.mem_clock_offset_mhz", 2100),
    ("rtx4090", "gpu0.app_clocks_mhz", [2520, 10501]),
])
def test_out_of_domain_is_refused_and_changes_nothing(tmp_path, sku, name, value):
    host = _host(tmp_path, sku)
    before = SimState(host.root).read()
    with pytest.raises(OutOfDomain) as ei:
        _knobs(host)[name].apply(value)
    assert name in str(ei.value)
    assert SimState(host.root).read() == before


def test_vm_host_is_read_only(tmp_path):
    host = _host(tmp_path, vm=True)
    k = _knobs(host)
    before = SimState(host.root).read()
    assert k["gpu0.power_limit_w"].read() == 700  # reads work
    for name, value in (("gpu0.power_limit_w", 600), ("gpu0.locked_clocks_mhz", 1500),
                        ("gpu0.persistence_mode", 0), ("gpu0.locked_mem_clocks_mhz", 2201)):
        with pytest.raises(OperationFailed, match="NoPermission"):
            k[name].apply(value)
    assert SimState(host.root).read() == before
    assert k["gpu0.locked_clocks_mhz"].read() is None


def test_rtx4090_offsets_via_set_clock_offsets_and_no_app_clocks(tmp_path):
    host = _host(tmp_path, "rtx4090")
    k = _knobs(host)
    g = k["gpu0.gpc_clock_offset_mhz"].limits()
    assert isinstance(g, IntRange) and (g.min, g.max, g.step) == (-990, 1500, 15)
    m = k["gpu0.mem_clock_offset_mhz"].limits()
    assert (m.min, m.max) == (-1000, 2000)
    assert k["gpu0.gpc_clock_offset_mhz"].apply(150) == 150
    assert k["gpu0.mem_clock_offset_mhz"].apply(-500) == -500
    st = _gpu_state(host)
    assert (st["gpc_offset"], st["mem_offset"]) == (150, -500)
    with pytest.raises(OutOfDomain):
        k["gpu0.gpc_clock_offset_mhz"].apply(1515)
    with pytest.raises(OutOfDomain):
        k["gpu0.gpc_clock_offset_mhz"].apply(10)  # off the 15 MHz grid
    assert isinstance(k["gpu0.app_clocks_mhz"].limits(), Unsupported)
    assert k["gpu0.app_clocks_mhz"].read() is None
    assert k["gpu0.locked_mem_clocks_mhz"].apply(5001) == [5001, 5001]
    assert k["gpu0.locked_mem_clocks_mhz"].read() == [5001, 5001]  # with a -500 offset applied


def test_offsets_fall_back_to_the_vf_offset_calls(tmp_path, monkeypatch):
    """When nvmlDeviceSetClockOffsets silently does nothing (older driver), the legacy call is used."""
    host = _host(tmp_path, "rtx4090")
    monkeypatch.setattr(FakeNVML, "nvmlDeviceSetClockOffsets", lambda self, device, info: 0)
    calls = []
    orig = FakeNVML.nvmlDeviceSetGpcClkVfOffset

    def legacy(self, device, offset):
        calls.append(offset)
        return orig(self, device, offset)

    monkeypatch.setattr(FakeNVML, "nvmlDeviceSetGpcClkVfOffset", legacy)
    assert _knobs(host)["gpu0.gpc_clock_offset_mhz"].apply(90) == 90
    assert calls == [90]


def test_silent_power_v2_failure_is_caught_by_the_read_back(tmp_path, monkeypatch):
    import pynvml

    host = _host(tmp_path)

    def v1_missing(self, handle, limit):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

    monkeypatch.setattr(FakeNVML, "nvmlDeviceSetPowerManagementLimit", v1_missing)
    k = _knobs(host)["gpu0.power_limit_w"]
    assert k.apply(500) == 500  # through _v2
    monkeypatch.setattr(FakeNVML, "nvmlDeviceSetPowerManagementLimit_v2",
                        lambda self, device, powerScope, powerLimit, version=0: 0)
    with pytest.raises(ReadbackMismatch, match="wrote 450 but read back 500"):
        k.apply(450)


def test_a_lock_reset_behind_our_back_reads_as_unlocked(tmp_path):
    """NVML has no locked-clock getter: the knob's record is trusted only while the live clock
    agrees. Under load, a clock above the recorded max shows the lock is gone."""
    import threading

    from tuner.sim.inject import inject
    from tuner.sim.workload import SimWorkload, WorkloadHang

    host = _host(tmp_path)
    k = _knobs(host)["gpu0.locked_clocks_mhz"]
    k.apply([1500, 1500])
    nv = FakeNVML(host.root)  # another tool (nvidia-smi -rgc) resets the lock
    nv.nvmlInit()
    nv.nvmlDeviceResetGpuLockedClocks(nv.nvmlDeviceGetHandleByIndex(0))
    inject(host.root, "hang")  # keeps the workload running while we look

    def run():
        with pytest.raises(WorkloadHang):
            SimWorkload(host.root).measure(1, timeout_s=0.6)

    t = threading.Thread(target=run)
    t.start()
    import time

    time.sleep(0.2)
    try:
        assert k.read() is None
    finally:
        t.join()


def test_dry_run_refuses_and_multi_gpu_names(tmp_path):
    host = _host(tmp_path, gpus=2, dry_run=True)
    k = _knobs(host)
    assert {"gpu0.power_limit_w", "gpu1.power_limit_w"} <= set(k)
    assert k["gpu0.power_limit_w"].identity() != k["gpu1.power_limit_w"].identity()
    with pytest.raises(DryRunRefused):
        k["gpu1.power_limit_w"].apply(600)
    assert _gpu_state(host, 1)["power_limit_mw"] == 700000
    d = k["gpu0.locked_clocks_mhz"].describe()
    assert d["domain"]["kind"] == "clock_lock" and d["value"] is None and d["unit"] == "MHz"


def test_no_nvml_means_no_gpu_knobs(tmp_path):
    host = _host(tmp_path)
    (host.root / "nvml" / "state.json").unlink()  # the driver is gone
    assert _knobs(open_host("sim", host.root)) == {}
    assert gpuknobs.discover  # provider still importable


def test_lock_record_is_forgotten_after_a_reboot(tmp_path):
    """The lock record lives in /run keyed by boot id: after a reboot (new boot id) NVML's locks are
    gone too, so the knob must not report the old one."""
    host = _host(tmp_path)
    k = _knobs(host)["gpu0.locked_mem_clocks_mhz"]
    k.apply([2201, 2201])
    assert k.read() == [2201, 2201]
    (host.root / "proc/sys/kernel/random/boot_id").write_text("5b8c0b9e-0000-4000-8000-000000000001\n")
    assert k.read() is None
