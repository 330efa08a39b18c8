"""benchmarks/energy_replay.py (the H200 run's replay of the two kept tables): per side and size
tokens/s, tokens/J and mean W, the ratios of the last table to the first and the issue's target
verdict; here on the tiny DeepSeek-V3.2 workload with a fake NVML board whose draw depends on
the table installed (the throughput table's 400 W, the energy table's 200 W)."""
from __future__ import annotations

import importlib.util
import json

import pytest

from kernelsearch import dispatch
from kernelsearch.energy import EnergyMeter
from tests.kernelsearch.fake_energy_nvml import FakeEnergyNVML
from tests.simhelpers import REPO
from tuner.workloads import energy as wenergy

WL = "deepseek-v3.2:batch=2:ctx=20"
SIZE = "decode@ctx20,b2"


def _script():
    spec = importlib.util.spec_from_file_location("energy_replay",
                                                  REPO / "benchmarks/energy_replay.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _tables(tmp_path):
    for name in ("throughput", "energy"):
        (tmp_path / f"{name}.json").write_text(json.dumps({"entries": [],
                                                           "meta": {"objective": name}}))
    return ["--table", f"throughput={tmp_path / 'throughput.json'}",
            "--table", f"energy={tmp_path / 'energy.json'}"]


def test_replay_prints_tokens_per_joule_watts_and_the_ratio(tmp_path, monkeypatch, capsys):
    def watts(t):
        return 200.0 if dispatch.installed().meta.get("objective") == "energy" else 400.0
    monkeypatch.setattr(wenergy, "meter_for",
                        lambda device: EnergyMeter(nvml=FakeEnergyNVML(watts), keep_open=True))
    monkeypatch.setattr(wenergy, "MIN_WINDOW_S", 0.1)
    rc = _script().main(["--workload", WL, *_tables(tmp_path), "--pairs", "2", "--repeats", "1",
                         "--out", str(tmp_path / "out")])
    assert rc == 0
    rep = json.loads((tmp_path / "out" / "energy-replay.json").read_text())
    med, x = rep["medians"], rep["ratios"][SIZE]
    assert med["throughput"][SIZE]["watts"] == pytest.approx(400, rel=0.05)
    assert med["energy"][SIZE]["watts"] == pytest.approx(200, rel=0.05)
    for m in ("tok_s", "tok_j", "watts"):
        assert x[m] == pytest.approx(med["energy"][SIZE][m] / med["throughput"][SIZE][m])
    # same kernels both sides: tok/s within noise, so tok/J ~2x from the watts alone
    assert x["tok_j"] == pytest.approx(2 * x["tok_s"], rel=0.1)
    assert x["target_met"] == (x["tok_j"] >= 1.3 and x["tok_s"] >= 0.95)
    assert rep["energy_source"] == "nvml_energy_counter"
    assert all(c["ok"] for c in rep["checks"].values())
    out = capsys.readouterr().out
    assert "| energy / throughput | decode@ctx20,b2 |" in out and "tokens/J" in out


def test_replay_on_the_cpu_measures_no_energy(tmp_path, capsys):
    rc = _script().main(["--workload", WL, *_tables(tmp_path), "--pairs", "1", "--repeats", "1"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "energy: not measured" in out and "no energy reading" in out


@pytest.mark.parametrize("args,why", [
    (["--table", "x=/nonexistent.json", "--table", "y=/nonexistent.json"], "--table x:"),
    (["--table", "only=PLACEHOLDER"], "expected two or more"),
])
def test_bad_tables_exit_2_with_one_line(tmp_path, capsys, args, why):
    (tmp_path / "t.json").write_text(json.dumps({"entries": []}))
    args = [a.replace("PLACEHOLDER", str(tmp_path / "t.json")) for a in args]
    assert _script().main(["--workload", WL, *args]) == 2
    err = capsys.readouterr().err.strip()
    assert why in err and len(err.splitlines()) == 1
