"""Under `--objective power-capped` the watts that decide are the parent's, not the model
process's (issue 42, item 2): a model process running candidate code reports 100 W for every
size; the search's own NVML reading around the request (here a fake NVML board drawing 700 W,
tests/kernelsearch/fake_energy_nvml.py, behind the real kernelsearch.energy.EnergyMeter) says
700 W, and the candidate is `over_power_budget` under a 600 W budget, not kept."""
from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.search.test_mixed_search import POLICY, interp  # noqa: F401 (fixture)
from tuner.sim.hostinit import init_host

# on the model process's path: every measurement claims 100 W a size (and tokens/J to match)
LIAR = """
import sys
if any(a.endswith("model_server") for a in sys.orig_argv):
    import tuner.workloads.llama as ll
    real = ll.LlamaWorkload.measure
    def measure(self, *a, **k):
        m = real(self, *a, **k)
        m.per_size_watts = {key: 100.0 for key in m.per_size}
        m.per_size_tok_per_j = {key: v / 100.0 for key, v in m.per_size.items()}
        m.energy_source = "nvml_energy_counter"
        m.extra["per_board_watts"] = {"gpu0": 100.0}
        return m
    ll.LlamaWorkload.measure = measure
"""


@pytest.mark.slow
def test_power_capped_decides_on_the_parents_watts_not_the_model_process_claim(
        tmp_path, interp, monkeypatch):  # noqa: F811
    from kernelsearch.energy import EnergyMeter
    from tests.kernelsearch.fake_energy_nvml import FakeEnergyNVML
    from tests.search.helpers import Scripted
    from tests.simhelpers import REPO
    from tuner.host import open_host
    from tuner.search import loop
    from tuner.search.mixed.run import build_evaluator
    from tuner.search.objective import PowerCapped
    from tuner.search.safety_context import SafetyContext
    from tuner.search.store import TrialStore
    from tuner.sim.llama_host import LLAMA_KW
    from tuner.trial import Candidate
    from tuner.workloads import parent_energy
    from tuner.workloads.model_process import ModelWorkload, Recipe

    board = FakeEnergyNVML(watts=700.0)
    monkeypatch.setattr(parent_energy, "meter_for",
                        lambda device: EnergyMeter(nvml=board, keep_open=True))
    site = Path(tempfile.mkdtemp(prefix="h42-watts-", dir="/tmp"))  # readable by the sandbox
    os.chmod(site, 0o755)
    try:
        (site / "sitecustomize.py").write_text(LIAR)
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), str(REPO)]))
        root = init_host(tmp_path / "h200", "h200", seed=2, os_tree=False)
        host = open_host("sim", root)
        wl = ModelWorkload(Recipe(llama=dict(LLAMA_KW), threads=1, timeout_s=60.0))
        guard = SafetyContext(host, tmp_path / "state", policy=POLICY)
        try:
            ev = build_evaluator({}, wl, guard, {"cuda_graphs": [True, False]}, [], rounds=1,
                                 repeats=2, timeout_s=30.0, objective=PowerCapped(power_budget_w=600))
            base = ev.measure_incumbent()
            with TrialStore.in_state_dir(tmp_path / "state") as ts:
                (trial,) = loop.run(Scripted(ev.joint.space, [
                    Candidate(runtime={"cuda_graphs": False})]),
                    ev, ts, ts.new_run("search-mixed", {}), 1).trials
        finally:
            guard.close()
            wl.close()
    finally:
        subprocess.run(["rm", "-rf", str(site)])
    assert base.per_size_watts and set(base.per_size_watts.values()) != {100.0}
    assert (trial.verdict, trial.reason) == ("reverted", "over_power_budget"), \
        (trial.verdict, trial.reason, [g.detail for g in trial.gates])
    h = trial.measurements["holistic"]
    assert all(w == pytest.approx(700.0, rel=0.05) for w in h["candidate_watts"].values()), h
    cand = h["candidate"][0]
    assert cand["extra"]["energy"]["reported"]["per_size_watts"] == \
        {k: 100.0 for k in cand["per_size"]}  # the claim, kept for the record, not believed
    assert "per_board_watts" not in cand["extra"]
