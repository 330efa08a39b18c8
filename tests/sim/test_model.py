"""The performance model has the shape the demo and the proposer benchmark rely on."""
from __future__ import annotations

import pytest

from tuner.sim import model
from tuner.sim.skus import H200, RTX4090


def _gpu(sku, chip=None, **kw):
    g = {**model.default_gpu_settings(sku), "chip": chip or {"gpc_margin": 0, "mem_margin": 0}}
    g.update(kw)
    return g


@pytest.mark.parametrize("sku", [H200, RTX4090])
def test_baseline_is_power_and_thermal_limited_and_the_optimum_is_interior(sku):
    chip = model.chip_params(sku, 1, 0)
    base = model.evaluate(sku, _gpu(sku, chip))
    assert base.regime == "power_capped+thermal_slowdown"
    assert base.reasons & model.SW_POWER_CAP and base.reasons & model.HW_THERMAL
    assert base.temp_c > sku.temp_slowdown
    opt = model.optimum(sku, chip, gpc_offset_step=60, mem_offset_step=500)  # coarse: test time
    ratio = base.throughput / opt["throughput"]
    assert 0.75 <= ratio <= 0.85, ratio
    s = opt["settings"]
    lo, hi = s["locked_clocks_mhz"]
    assert lo == hi and sku.gr_max * 0.75 < lo < sku.gr_max  # pinned below the top
    assert s["power_limit_w"] < sku.power_default_w
    assert s["locked_mem_clocks_mhz"] == [sku.mem_top, sku.mem_top]
    # the optimum setting really is stable and under the thermal threshold
    best = model.evaluate(sku, _gpu(sku, chip, locked_gr=[lo, lo], power_limit_mw=s["power_limit_w"] * 1000,
                                    gpc_offset=s["gpc_clock_offset_mhz"], mem_offset=s["mem_clock_offset_mhz"]))
    assert best.xid_prob == 0 and best.hang_prob == 0
    assert best.throughput == pytest.approx(opt["throughput"])
    # unlocked at the best power limit is a few % short: pinning matters
    unl = model.evaluate(sku, _gpu(sku, chip, power_limit_mw=s["power_limit_w"] * 1000))
    assert unl.throughput < opt["throughput"] * 0.97


def test_pinning_above_the_power_limit_brakes_then_becomes_unstable():
    ok = model.evaluate(H200, _gpu(H200, locked_gr=[1770, 1770], power_limit_mw=700000))
    assert ok.regime == "ok" and ok.xid_prob == 0
    p1905 = float(model.power_w(H200, 1905, 3201))
    assert 700 < p1905 < 700 * 1.08  # just over the limit: power brake, a big penalty
    brake = model.evaluate(H200, _gpu(H200, locked_gr=[1905, 1905], power_limit_mw=700000))
    assert brake.regime.startswith("power_brake") and brake.xid_prob == 0
    assert brake.throughput < 0.8 * ok.throughput
    assert brake.reasons & model.HW_POWER_BRAKE
    bad = model.evaluate(H200, _gpu(H200, locked_gr=[1980, 1980], power_limit_mw=700000))
    assert bad.regime.startswith("unstable") and bad.xid_prob >= 0.6 and bad.hang_prob > 0
    assert set(bad.xid_choices) == {79, 62}
    worse = model.evaluate(H200, _gpu(H200, locked_gr=[1980, 1980], power_limit_mw=500000))
    assert worse.xid_prob >= bad.xid_prob and worse.throughput <= bad.throughput
    assert bad.throughput < brake.throughput  # a run that escapes the Xid is still slow


def test_geforce_offsets_beyond_the_chip_margin_raise_xid_13_43():
    chip = model.chip_params(RTX4090, 7, 0)
    assert 150 <= chip["gpc_margin"] <= 200
    safe = model.evaluate(RTX4090, _gpu(RTX4090, chip, gpc_offset=chip["gpc_margin"] - 10))
    assert safe.xid_prob == 0
    bad = model.evaluate(RTX4090, _gpu(RTX4090, chip, gpc_offset=chip["gpc_margin"] + 30))
    assert bad.xid_prob > 0.5 and set(bad.xid_choices) == {13, 43}
    # below the margin, an offset buys clock at the same power
    f = 2400
    assert float(model.power_w(RTX4090, f, 10501, 150)) < float(model.power_w(RTX4090, f, 10501, 0))
    assert model.chip_params(RTX4090, 7, 0) == chip and model.chip_params(RTX4090, 8, 0) != chip


def test_true_throughput_sums_gpus():
    st = {"sku": "h200", "gpus": [_gpu(H200), _gpu(H200, locked_gr=[1770, 1770])]}
    a = model.evaluate(H200, st["gpus"][0]).throughput
    b = model.evaluate(H200, st["gpus"][1]).throughput
    assert model.true_throughput(st) == pytest.approx(a + b) and b > a
