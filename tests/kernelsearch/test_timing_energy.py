"""Each judged kernel timing also reports joules per call and mean watts (timing.energy_per_call /
energy_costs), and the best library kernel's beside it (energy_vs_library). On the CPU nothing is
measured unless a meter is handed in; here it is one over a fake NVML board."""
from __future__ import annotations

import time

import pytest

from kernelsearch.energy import SOURCE_COUNTER, EnergyMeter
from kernelsearch.harness import timing as tm
from tests.kernelsearch.fake_energy_nvml import FakeEnergyNVML
from tests.kernelsearch.test_libraries import _fresh, flash_attn  # noqa: F401


def _sleeper(ms: float):
    def fn(*a):
        time.sleep(ms / 1e3)
    return fn


def test_energy_per_call_is_joules_over_calls_and_mean_watts():
    meter = EnergyMeter(nvml=FakeEnergyNVML(watts=400.0))
    r = tm.energy_per_call(_sleeper(2), [(), ()], "cpu", seconds=0.2, meter=meter)
    assert r["energy_source"] == SOURCE_COUNTER
    assert r["mean_w"] == pytest.approx(400.0, rel=0.05)
    assert r["energy_calls"] >= 2 and r["energy_calls"] % 2 == 0  # whole passes over the sets
    window = meter.reading.seconds
    assert r["energy_j"] == pytest.approx(400.0 * window / r["energy_calls"], rel=0.05)
    assert r["energy_overhead"] < 0.01


def test_no_energy_off_cuda_without_a_meter_and_a_reason_when_unavailable():
    assert tm.energy_per_call(_sleeper(0), [()], "cpu") == {}
    r = tm.energy_per_call(_sleeper(0), [()], "cpu", seconds=0.01,
                           meter=EnergyMeter(nvml=FakeEnergyNVML(counter=False, power=False)))
    assert r["energy_source"] == "" and "energy_j" not in r
    assert "nvmlDeviceGetPowerUsage" in r["energy_error"]


def test_energy_costs_never_raises():
    def boom(*a):
        raise RuntimeError("capture failed")
    r = tm.energy_costs(boom, None, [()], "cuda")  # CUDA path on a CPU machine: recorded, not raised
    assert r["energy_source"] == "" and r["energy_error"]


def _fake_energy(monkeypatch, watts):
    real = tm.energy_per_call
    seen = []

    def on_fake_gpu(fn, sets, device, seconds=0.05, meter=None):
        seen.append(fn)
        return real(fn, sets, device, seconds=0.05,
                    meter=EnergyMeter(nvml=FakeEnergyNVML(watts=watts)))
    monkeypatch.setattr(tm, "energy_per_call", on_fake_gpu)
    return seen


def test_judged_timing_records_energy_beside_time_and_the_librarys(monkeypatch, flash_attn):
    """The judge's per-shape record (the verdict's timings) carries energy_j / mean_w and the
    library kernel's energy where it timed one: what a table entry is built from."""
    from kernelsearch.families import get
    from kernelsearch.harness.judge import judge

    seen = _fake_energy(monkeypatch, 500.0)
    fam = get("decode_attention")
    shape = (1, 2, 1, 20, 64)
    cfg = {"BLOCK_N": 16, "SPLIT": 128, "STAGES": 1, "num_warps": 2}
    v = judge("decode_attention", fam.variants["splitkv"].file.read_text(), cfg, device="cpu",
              shapes=[shape], timing_shapes=[shape], random_shapes=0, seeds=1, reps=2,
              boundary=False)
    assert v.accepted, v.detail
    t = next(iter(v.timings.values()))
    assert len(seen) == 2  # ours, then the library's
    assert t["energy_source"] == SOURCE_COUNTER and t["mean_w"] == pytest.approx(500, rel=0.05)
    assert t["energy_j"] > 0 and t["library_energy_j"] > 0
    assert t["energy_vs_library"] == pytest.approx(t["library_energy_j"] / t["energy_j"])
    assert "median_us" in t and t["library"] == "flash_attn"  # time still beside it

    from tuner.search.kernel import verdict_record

    rec = verdict_record(v)  # what the search keeps of it
    assert rec["energy_j"] == t["energy_j"] and rec["energy_vs_library"] == t["energy_vs_library"]
