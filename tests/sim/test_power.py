"""The simulated GPU's power model (tuner/sim/power.py over tuner/sim/model.py), the energy the
sim workload reports, and the fake NVML's energy counter: monotonicity, calibration points,
wrap-around and a GPU without the counter."""
from __future__ import annotations

import time

import numpy as np
import pynvml
import pytest

from tuner.sim import energy_optimum, model, power
from tuner.sim.fake_pynvml import FakeNVML
from tuner.sim.hostinit import init_host
from tuner.sim.skus import H200, RTX4090, get_sku
from tuner.sim.state import SimState
from tuner.sim.workload import SimWorkload


@pytest.mark.parametrize("sku", [H200, RTX4090])
def test_power_rises_with_clock_memory_clock_and_utilisation(sku):
    f = np.array(sorted(sku.graphics_clocks()), dtype=float)
    p = model.power_w(sku, f, sku.mem_top)
    assert np.all(np.diff(p) > 0)  # higher SM clock: more watts
    lo, hi = sorted(sku.mem_clocks)[0], sku.mem_top
    assert model.power_w(sku, 1500, lo) < model.power_w(sku, 1500, hi)
    w = [power.board_power(sku, 600.0, u) for u in (0.0, 0.25, 0.5, 1.0)]
    assert w[0] == pytest.approx(sku.idle_power_w) and w[-1] == pytest.approx(600.0)
    assert w == sorted(w)
    # a higher power limit never draws less, and never more than the limit
    g = energy_optimum.grid(sku)
    unlocked = g["watts"][0, -1, :]
    assert np.all(np.diff(unlocked) >= -1e-6)
    assert np.all(unlocked <= g["powers"] + 1e-6)


def test_h200_calibration_points():
    """Datasheet TDP, NVML's limits and idle draw from the probe, and decode at stock at the
    limit (docs/readings: 684-720 W dense MLA decode at the 700 W limit)."""
    assert (H200.power_min_w, H200.power_max_w, H200.power_default_w) == (200, 700, 700)
    assert H200.idle_power_w == pytest.approx(86.8)
    full = model.power_w(H200, H200.gr_max, H200.mem_top)
    assert full > 700  # a busy decode at the top clock wants more than the TDP: capped
    cool = {**model.default_gpu_settings(H200), "power_limit_mw": 550_000}
    o = model.evaluate(H200, cool)
    assert o.regime == "power_capped" and o.power_w == pytest.approx(550, abs=1)


@pytest.mark.parametrize("sku", [H200, RTX4090])
def test_energy_optimum_saves_energy_at_a_few_percent_of_throughput(sku):
    """The shape Zeus (NSDI'23) and Perseus (SOSP'24) report for memory-bound work: a power/clock
    setting well under the TDP gives >= 10% more tokens/J for <= 5% of throughput."""
    best = energy_optimum.energy_optimum(sku, floor=0.95)
    base = best["baseline"]
    assert best["throughput"] >= 0.95 * base["throughput"]
    assert best["tok_per_j"] >= 1.10 * base["tok_per_j"]
    assert best["watts"] < 0.8 * sku.power_default_w


def test_sim_workload_reports_energy_from_the_model(tmp_path):
    root = init_host(tmp_path / "h", "h200", seed=1, os_tree=False)
    m = SimWorkload(root).measure(repeats=3)
    o = model.evaluate("h200", SimState(root).read()["gpus"][0])
    assert m.energy_source == "sim_model"
    assert m.per_size_watts == {"all": pytest.approx(o.power_w, abs=0.1)}
    assert m.per_size_tok_per_j["all"] == pytest.approx(m.value / o.power_w, rel=1e-3)


def _nvml(root):
    nv = FakeNVML(root)
    nv.nvmlInit()
    return nv, nv.nvmlDeviceGetHandleByIndex(0)


def _busy_at(root, watts):
    """The GPU seen running a workload that draws `watts` (as a hung sim run is), from now."""
    import os

    with SimState(root).edit() as st:
        g = st["gpus"][0]
        power.fold(g, get_sku(st["sku"]), busy=bool(g.get("busy")))
        g["last_run"] = {**(g.get("last_run") or {}), "power_w": watts}
        g["busy"] = {"pid": os.getpid(), "since": 0}


def test_energy_counter_is_the_integral_of_the_reported_power(tmp_path):
    root = init_host(tmp_path / "h", "h200", seed=1, os_tree=False)
    nv, h = _nvml(root)
    assert nv.nvmlDeviceGetPowerUsage(h) == int(H200.idle_power_w * 1000)
    _busy_at(root, 650.0)
    assert nv.nvmlDeviceGetPowerUsage(h) == 650_000
    e0, t0 = nv.nvmlDeviceGetTotalEnergyConsumption(h), time.time()
    time.sleep(0.3)
    e1, t1 = nv.nvmlDeviceGetTotalEnergyConsumption(h), time.time()
    assert (e1 - e0) / 1000 / (t1 - t0) == pytest.approx(650.0, rel=0.05)
    # a completed sim run reports its energy from the model and leaves the counter at idle rate
    with SimState(root).edit() as st:
        st["gpus"][0]["busy"] = None
    m = SimWorkload(root).measure(repeats=2)
    assert m.energy_source == "sim_model" and m.per_size_watts["all"] > 300


def test_energy_counter_wraps_around(tmp_path):
    root = init_host(tmp_path / "h", "h200", seed=1, os_tree=False)
    with SimState(root).edit() as st:
        st["gpus"][0]["energy_wrap_mj"] = 1_000_000  # a counter that wraps every 1 kJ
        st["gpus"][0]["energy_mj"] = 1_000_000 - 20_000.0  # 20 J (~0.23 s at idle) before it
        st["gpus"][0]["energy_t"] = time.time()
    nv, h = _nvml(root)
    before = nv.nvmlDeviceGetTotalEnergyConsumption(h)
    time.sleep(0.5)  # ~43 J at idle: past the wrap
    after = nv.nvmlDeviceGetTotalEnergyConsumption(h)
    assert after < before and (after - before) % 1_000_000 > 0


def test_energy_meter_reads_the_sim_counter_across_its_64_bit_wrap(tmp_path):
    from kernelsearch.energy import SOURCE_COUNTER, EnergyMeter

    root = init_host(tmp_path / "h", "h200", seed=1, os_tree=False)
    with SimState(root).edit() as st:
        st["gpus"][0]["energy_mj"] = float((1 << 64) - 50_000)  # 50 J before NVML's wrap
        st["gpus"][0]["energy_t"] = time.time()
    _busy_at(root, 500.0)
    with EnergyMeter(nvml=FakeNVML(root)) as meter:
        time.sleep(0.3)  # ~150 J: the counter wraps inside the window
    r = meter.reading
    assert r.source == SOURCE_COUNTER, r
    assert r.mean_w == pytest.approx(500.0, rel=0.1)  # float state: +-4 J near 2^64


def test_a_gpu_without_the_counter_falls_back_to_power_samples(tmp_path):
    from kernelsearch.energy import SOURCE_SAMPLES, EnergyMeter

    root = init_host(tmp_path / "h", "rtx4090", seed=1, os_tree=False)
    with SimState(root).edit() as st:
        st["gpus"][0]["energy_counter"] = False
    nv, h = _nvml(root)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nv.nvmlDeviceGetTotalEnergyConsumption(h)
    _busy_at(root, 333.0)
    with EnergyMeter(nvml=FakeNVML(root), sample_hz=20) as meter:
        time.sleep(0.4)
    r = meter.reading
    assert r.source == SOURCE_SAMPLES and r.samples >= 3, r
    assert "NotSupported" in r.reason
    assert r.mean_w == pytest.approx(333.0, rel=0.02)
