"""SimWorkload: noisy but reproducible measurements, sensors while running, Xids for unstable
settings, and hangs that really block until the timeout."""
from __future__ import annotations

import statistics
import threading
import time

import pynvml
import pytest

from tests.sim.conftest import make_host
from tuner.sim import model
from tuner.sim.fake_pynvml import FakeNVML
from tuner.sim.inject import inject
from tuner.sim.state import SimState
from tuner.sim.workload import SimWorkload, WorkloadHang
from tuner.trial import Measurement


def test_measure_noise_and_determinism_by_seed(tmp_path):
    a, b, c = (make_host(tmp_path, seed=s, name=n) for s, n in ((1, "a"), (1, "b"), (2, "c")))
    ma = [SimWorkload(a).measure(5) for _ in range(3)]
    mb = [SimWorkload(b).measure(5) for _ in range(3)]
    mc = SimWorkload(c).measure(5)
    assert isinstance(ma[0], Measurement) and ma[0].metric == "throughput" and ma[0].unit == "tok/s"
    assert [m.samples for m in ma] == [m.samples for m in mb]
    assert mc.samples != ma[0].samples
    samples = [s for m in [SimWorkload(a).measure(20) for _ in range(5)] for s in m.samples]
    true = model.true_throughput(SimState(a).read())
    spread = statistics.pstdev(samples) / true
    assert 0.01 < spread < 0.035
    assert abs(statistics.mean(samples) / true - 1) < 0.015


def test_running_publishes_sensors_then_goes_idle(h200):
    nv = FakeNVML(h200)
    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(0)
    m = SimWorkload(h200).measure(3)
    assert m.extra["gpus"][0]["regime"] == "power_capped+thermal_slowdown"
    assert nv.nvmlDeviceGetUtilizationRates(h).gpu == 0
    assert nv.nvmlDeviceGetComputeRunningProcesses(h) == []
    # slowdown reasons and the temperature of the last run stay visible to health monitors
    r = nv.nvmlDeviceGetCurrentClocksEventReasons(h)
    assert r & pynvml.nvmlClocksEventReasonHwThermalSlowdown and r & pynvml.nvmlClocksEventReasonGpuIdle
    assert nv.nvmlDeviceGetTemperature(h, 0) > nv.nvmlDeviceGetTemperatureThreshold(h, 1)


def test_injected_hang_blocks_until_timeout_and_is_seen_as_busy(h200):
    inject(h200, "hang")
    nv = FakeNVML(h200)
    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(0)
    seen = {}

    def probe():
        time.sleep(0.15)
        seen["util"] = nv.nvmlDeviceGetUtilizationRates(h).gpu
        seen["pids"] = [p.pid for p in nv.nvmlDeviceGetComputeRunningProcesses(h)]
        seen["power"] = nv.nvmlDeviceGetPowerUsage(h)

    t = threading.Thread(target=probe)
    t.start()
    t0 = time.monotonic()
    with pytest.raises(WorkloadHang):
        SimWorkload(h200).measure(3, timeout_s=0.4)
    assert time.monotonic() - t0 >= 0.4
    t.join()
    import os
    assert seen["util"] == 100 and os.getpid() in seen["pids"] and seen["power"] > 500_000
    assert nv.nvmlDeviceGetUtilizationRates(h).gpu == 0  # idle again after giving up
    SimWorkload(h200).measure(1, timeout_s=0.4)  # one-shot: the next run completes


def test_unstable_pinned_clock_queues_xids(h200):
    nv = FakeNVML(h200)
    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(0)
    es = nv.nvmlEventSetCreate()
    nv.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, es)
    nv.nvmlDeviceSetGpuLockedClocks(h, 1980, 1980)
    nv.nvmlDeviceSetPowerManagementLimit(h, 600000)
    xids, hangs = [], 0
    for _ in range(12):
        try:
            xids += SimWorkload(h200).measure(2, timeout_s=0.05).extra["xids"]
        except WorkloadHang:
            hangs += 1
    got = []  # every Xid, also those of runs that then hung, reaches the event set
    while True:
        try:
            got.append(nv.nvmlEventSetWait(es, 50).eventData)
        except pynvml.NVMLError_Timeout:
            break
    assert len(got) >= 6 and set(got) <= {79, 62}
    assert len(got) >= len(xids) and all(got.count(x) >= xids.count(x) for x in set(xids))
    assert "NVRM: Xid (PCI:0000:18:00): " in (h200 / "dev" / "kmsg").read_text()


def test_injected_thermal_and_power_brake_cost_throughput(h200):
    w = SimWorkload(h200)
    before = model.true_throughput(SimState(h200).read())
    inject(h200, "thermal")
    inject(h200, "power-brake")
    st = SimState(h200).read()
    assert model.true_throughput(st) < 0.5 * before
    nv = FakeNVML(h200)
    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(0)
    r = nv.nvmlDeviceGetCurrentClocksEventReasons(h)
    assert r & pynvml.nvmlClocksEventReasonHwThermalSlowdown and r & pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown
    assert nv.nvmlDeviceGetTemperature(h, 0) >= 90
    inject(h200, "clear")
    assert model.true_throughput(SimState(h200).read()) == pytest.approx(before)
    assert w.canary(timeout_s=0.2) is True
