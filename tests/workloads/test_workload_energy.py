"""The holistic workloads (DeepSeek, Llama) fill Measurement.per_size_tok_per_j / per_size_watts /
energy_source from the energy meter on a GPU (here: a fake NVML standing in for the CUDA meter),
and nothing on the CPU; the fields survive the model process's reply (model_dump -> validate)."""
from __future__ import annotations

import pytest

from kernelsearch.energy import EnergyMeter
from tests.kernelsearch.fake_energy_nvml import FakeEnergyNVML
from tuner.trial import Measurement
from tuner.workloads import energy as wenergy
from tuner.workloads.deepseek import DeepSeekWorkload
from tuner.workloads.llama import LlamaWorkload

KINDS = {"deepseek": DeepSeekWorkload, "llama": LlamaWorkload}


def _wl(kind: str):
    return KINDS[kind]("tiny", contexts=[20, 40], decode_batches=[2], device="cpu",
                       decode_steps=2, check_outputs=False)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_cpu_measures_no_energy(kind):
    m = _wl(kind).measure(repeats=2)
    assert m.per_size and m.energy_source == ""
    assert m.per_size_tok_per_j == {} and m.per_size_watts == {}


@pytest.fixture
def fake_gpu_meter(monkeypatch):
    """meter_for hands out a kept-open meter over a fake NVML board drawing 350 W, as it would
    an NVML meter for a CUDA device; the window minimum shortened for the CPU."""
    fakes: list[FakeEnergyNVML] = []

    def meter_for(device):
        fakes.append(FakeEnergyNVML(watts=350.0))
        return EnergyMeter(nvml=fakes[-1], keep_open=True)
    monkeypatch.setattr(wenergy, "meter_for", meter_for)
    monkeypatch.setattr(wenergy, "MIN_WINDOW_S", 0.15)
    return fakes


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_gpu_meter_fills_tokens_per_joule_and_watts_per_size(kind, fake_gpu_meter):
    m = _wl(kind).measure(repeats=2)
    assert set(m.per_size_watts) == set(m.per_size_tok_per_j) == set(m.per_size)
    assert m.energy_source == "nvml_energy_counter"
    for k, tps in m.per_size.items():
        assert m.per_size_watts[k] == pytest.approx(350.0, rel=0.05)
        assert m.per_size_tok_per_j[k] == pytest.approx(tps / m.per_size_watts[k])
    e = m.extra["energy"]
    assert all(s >= 0.15 for s in e["windows_s"].values())  # topped up to the minimum window
    assert e["overhead"] < 0.01 and e["unmeasured"] == {}
    (fake,) = fake_gpu_meter  # one meter per measurement, NVML initialised once, shut down after
    assert fake.inited == 0 and fake.calls.count("nvmlInit") == 1
    # the model process's reply: a dumped Measurement validated on the other side
    back = Measurement.model_validate(m.model_dump())
    assert back.per_size_tok_per_j == m.per_size_tok_per_j and back.energy_source == m.energy_source


def test_power_samples_where_the_counter_is_missing(monkeypatch):
    monkeypatch.setattr(wenergy, "meter_for", lambda device: EnergyMeter(
        nvml=FakeEnergyNVML(watts=200.0, counter=False), sample_hz=50, keep_open=True))
    monkeypatch.setattr(wenergy, "MIN_WINDOW_S", 0.15)
    m = _wl("llama").measure(repeats=1)
    assert m.energy_source == "nvml_power_samples"
    assert all(w == pytest.approx(200.0, rel=0.05) for w in m.per_size_watts.values())


def test_unavailable_meter_says_why_and_fills_nothing(monkeypatch):
    monkeypatch.setattr(wenergy, "meter_for", lambda device: EnergyMeter(
        nvml=FakeEnergyNVML(counter=False, power=False), keep_open=True))
    monkeypatch.setattr(wenergy, "MIN_WINDOW_S", 0.0)
    m = _wl("deepseek").measure(repeats=1)
    assert m.energy_source == "" and m.per_size_tok_per_j == {}
    assert all("nvmlDeviceGetPowerUsage" in why for why in m.extra["energy"]["unmeasured"].values())


def test_a_failing_size_closes_the_meter(monkeypatch, fake_gpu_meter):
    from tuner.workloads.holistic import WorkloadFailed

    wl = _wl("llama")
    real = wl.bench.runner

    def runner(rt, kind, b, ctx):
        r = real(rt, kind, b, ctx)
        if ctx == 40:
            r.tokens_per_s = lambda steps: (_ for _ in ()).throw(RuntimeError("CUDA error: boom"))
        return r
    monkeypatch.setattr(wl.bench, "runner", runner)
    with pytest.raises(WorkloadFailed):
        wl.measure(repeats=1)
    assert fake_gpu_meter and all(f.inited == 0 for f in fake_gpu_meter)


def test_the_environment_sets_a_longer_window_and_bad_values_keep_the_default(monkeypatch,
                                                                              fake_gpu_meter):
    monkeypatch.setenv(wenergy.WINDOW_ENV, "0.4")
    m = _wl("llama").measure(repeats=1)
    assert all(s >= 0.4 for s in m.extra["energy"]["windows_s"].values())
    for bad in ("", "fast", "-1", "0", "1e9", "nan"):
        monkeypatch.setenv(wenergy.WINDOW_ENV, bad)
        assert wenergy.min_window_s() == 0.15  # the (patched) default
