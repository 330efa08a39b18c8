"""The simulated GPU's power model (tuner/sim/power.py over tuner/sim/model.py), the energy the
sim workload reports, and the fake NVML's energy counter: monotonicity, calibration points,
wrap-around and a GPU without the counter."""
from __future__ import annotations

import numpy as np
import pynvml
import pytest

from tuner.sim import energy_optimum, model, power
from tuner.sim.fake_pynvml import FakeNVML
from tuner.sim.hostinit import init_host
from tuner.sim.skus import H200, RTX4090
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
    limit (shared/facts: 684-720 W dense MLA decode at the 700 W limit)."""
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


def test_energy_counter_advances_with_each_run_at_the_modelled_draw(tmp_path):
    root = init_host(tmp_path / "h", "h200", seed=1, os_tree=False)
    nv, h = _nvml(root)
    e0 = nv.nvmlDeviceGetTotalEnergyConsumption(h)
    m = SimWorkload(root).measure(repeats=2)
    e1 = nv.nvmlDeviceGetTotalEnergyConsumption(h)
    run_mj = m.per_size_watts["all"] * power.WINDOW_S * 2 * 1000
    # the run, plus idle draw over the few ms of wall time between the reads
    assert run_mj <= e1 - e0 <= run_mj + H200.idle_power_w * 1000 * 2.0
    # idle: the counter advances at the power NVML reports
    assert nv.nvmlDeviceGetPowerUsage(h) == int(H200.idle_power_w * 1000)


def test_energy_counter_wraps_around(tmp_path):
    root = init_host(tmp_path / "h", "h200", seed=1, os_tree=False)
    with SimState(root).edit() as st:
        st["gpus"][0]["energy_wrap_mj"] = 1_000_000  # a counter that wraps every 1 kJ
        st["gpus"][0]["energy_mj"] = 1_000_000 - 50_000.0
    nv, h = _nvml(root)
    before = nv.nvmlDeviceGetTotalEnergyConsumption(h)
    SimWorkload(root).measure(repeats=1)  # ~600 J: past the wrap
    after = nv.nvmlDeviceGetTotalEnergyConsumption(h)
    assert after < before  # wrapped
    assert (after - before) % 1_000_000 == pytest.approx(
        SimState(root).read()["gpus"][0]["last_run"]["power_w"] * 1000, abs=2_000)


def test_a_gpu_without_the_counter_answers_not_supported_and_power_samples_remain(tmp_path):
    root = init_host(tmp_path / "h", "rtx4090", seed=1, os_tree=False)
    with SimState(root).edit() as st:
        st["gpus"][0]["energy_counter"] = False
    nv, h = _nvml(root)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nv.nvmlDeviceGetTotalEnergyConsumption(h)
    # the fallback: power samples (idle here; the modelled draw while a run is busy)
    assert nv.nvmlDeviceGetPowerUsage(h) == int(RTX4090.idle_power_w * 1000)
    with SimState(root).edit() as st:
        g = st["gpus"][0]
        g["last_run"] = {"power_w": 333.0}
        import os
        g["busy"] = {"pid": os.getpid(), "since": 0}
    assert nv.nvmlDeviceGetPowerUsage(h) == 333_000
