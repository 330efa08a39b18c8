"""Every number at every edge is finite and bounded (issue 15, item 3): a probation of `inf`
never ends and holds the writer for ever; NaN in a policy range compares false with every value,
so the bound is skipped and the change goes through. Each is refused: exit 2, one line, and
nothing reaches a knob."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from safety import Journal, PolicyError, Transaction
from safety import policy as pol
from tests.safety import _knobs

MAX_PROBATION_S = 86400.0  # safety.bounds.MAX_PROBATION_S: a day

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("doc, field", [
    ({"defaults": {"probation_s": float("inf")}}, "defaults.probation_s"),
    ({"defaults": {"probation_s": float("nan")}}, "defaults.probation_s"),
    ({"defaults": {"probation_s": MAX_PROBATION_S * 2}}, "defaults.probation_s"),
    ({"rules": [{"knob": "gpu*", "probation_s": float("inf")}]}, "rules[0].probation_s"),
    ({"rules": [{"knob": "gpu*", "range": [float("nan"), 650]}]}, "rules[0].range[0]"),
    ({"rules": [{"knob": "gpu*", "range": [100, float("inf")]}]}, "rules[0].range[1]"),
    ({"rules": [{"knob": "gpu*", "max_step": float("nan")}]}, "rules[0].max_step"),
    ({"rules": [{"knob": "gpu*", "min_fraction_of_default": float("nan")}]},
     "rules[0].min_fraction_of_default"),
    ({"rules": [{"knob": "gpu*", "values": [600, float("nan")]}]}, "rules[0].values"),
])
def test_policy_refuses_non_finite_numbers(doc, field):
    with pytest.raises(PolicyError) as e:
        pol.Policy.from_dict({"version": 1, **doc}, "p.yaml")
    assert f"field {field}" in str(e.value) and "\n" not in str(e.value)
    assert e.value.exit_code == 2


def test_yaml_inf_and_nan_spellings_are_refused(tmp_path):
    for text in ("defaults: {probation_s: .inf}\n",
                 "rules:\n  - knob: 'gpu*'\n    range: [.nan, 650]\n"):
        p = tmp_path / "p.yaml"
        p.write_text("version: 1\n" + text)
        with pytest.raises(PolicyError):
            pol.load(p)


@pytest.mark.parametrize("probation", [float("inf"), float("nan"), -1.0, MAX_PROBATION_S + 1])
def test_transaction_refuses_an_endless_probation_before_writing(tmp_path, probation):
    from safety.errors import OutOfBounds

    _knobs.init(tmp_path / "h", {"gpu0.power_limit_w": 700})
    knobs = _knobs.make(str(tmp_path / "h"))
    j = Journal(tmp_path / "state" / "journal.db")
    policy = pol.Policy.from_dict({"rules": [{"knob": "gpu0.power_limit_w"}]})
    with pytest.raises(OutOfBounds):
        Transaction(j, knobs, {"gpu0.power_limit_w": 600}, policy=policy, probation_s=probation,
                    state_dir=tmp_path / "state", watchdog="none").begin()
    assert knobs["gpu0.power_limit_w"].read() == 700
    assert j.txns() == [] and j.baseline() == {}


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("METALTUNE_")}
    env.update(PYTHONPATH=str(REPO), METALTUNE_RUN_DIR="/nonexistent-run-dir")
    return subprocess.run([sys.executable, "-m", "tuner", *args], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=120)


@pytest.fixture
def sim(tmp_path):
    root = tmp_path / "sim"
    assert _cli("sim", "init", str(root), "--sku", "h200").returncode == 0
    return root


def _power(sim: Path) -> float:
    from tuner.sim.fake_pynvml import FakeNVML

    nv = FakeNVML(sim)
    nv.nvmlInit()
    try:
        return nv.nvmlDeviceGetPowerManagementLimit(nv.nvmlDeviceGetHandleByIndex(0)) / 1000.0
    finally:
        nv.nvmlShutdown()


@pytest.mark.parametrize("extra", [["--probation", "inf"], ["--probation", "1e9"], ["--policy", "INF"],
                                   ["--policy", "NAN"]])
def test_cli_apply_refuses_non_finite_probation_and_policy(tmp_path, sim, extra):
    prof = tmp_path / "p.yaml"
    prof.write_text("name: t\nknobs:\n  gpu0.power_limit_w: 600\n")
    if extra[-1] == "INF":
        (tmp_path / "inf.yaml").write_text("version: 1\ndefaults: {probation_s: .inf}\n"
                                           "rules:\n  - knob: 'gpu*.power_limit_w'\n")
        extra = ["--policy", str(tmp_path / "inf.yaml")]
    elif extra[-1] == "NAN":
        (tmp_path / "nan.yaml").write_text("version: 1\nrules:\n  - knob: 'gpu*.power_limit_w'\n"
                                           "    range: [.nan, 650]\n    probation_s: 0.2\n")
        extra = ["--policy", str(tmp_path / "nan.yaml")]
    r = _cli("--state-dir", str(tmp_path / "state"), "--backend", "sim", "--sim-root", str(sim),
             "apply", str(prof), *extra)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    # named by the model's field, or already by the YAML loader ("not a finite number")
    assert any(w in r.stderr for w in ("probation", "range", "finite")), r.stderr
    assert _power(sim) == 700  # nothing was applied


@pytest.mark.parametrize("line, field", [("probation_s = inf", "probation_s"),
                                         ("probation_s = nan", "probation_s"),
                                         ("probation_s = 1e12", "probation_s"),
                                         ("health_interval_s = nan", "health_interval_s"),
                                         ("[search]\ntimeout_s = inf", "search.timeout_s"),
                                         ("[search]\nidle_for_s = nan", "search.idle_for_s")])
def test_daemon_config_refuses_non_finite_numbers(tmp_path, sim, line, field):
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'backend = "sim"\nsim_root = "{sim}"\n{line}\n')
    r = _cli("daemon", "--check", "--config", str(cfg))
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert f"field {field}" in r.stderr and str(cfg) in r.stderr
