"""A model workload is one module plus one registry line (tests/workloads/tiny_model_workload.py,
`register(..., model_process=True)`): a real `search mixed` on it holds it in a model process and
tries the store's kernel sources on it. The same workload registered without `model_process`
runs in the search's process, where a stored source is never imported: the search does not
offer the store's sources, and says why."""
from __future__ import annotations

import importlib
import json

import pytest

from tests.simhelpers import REPO, run_cli
from tuner.sim.hostinit import init_host

POLICY = str(REPO / "tuner/data/demo-policy.yaml")
GOOD = json.loads((REPO / "tests/proposers/llm/recordings/good_kernel.json").read_text())[
    "content"][-1]["input"]


@pytest.fixture
def registry(monkeypatch):
    """The test workload's module imported (its register line runs); the registry restored
    after. The model process finds the module on PYTHONPATH, as any project module."""
    from tuner.workloads import factory

    before = dict(factory._REGISTRY)
    import tests.workloads.tiny_model_workload as mod

    importlib.reload(mod)
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # table kernels on CPU tensors
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    yield mod
    factory._REGISTRY.clear()
    factory._REGISTRY.update(before)


def _store_source(state) -> str:
    from kernelsearch.store import SourceStore, environment

    store = SourceStore(state / "kernels" / "sources")
    return store.put("rmsnorm", GOOD["source"], GOOD["config"],
                     {"verdict": "accepted", "code": "accepted"}, env=environment("cpu")).sha256


def _search(capsys, tmp_path, workload: str) -> tuple[dict, list]:
    from tuner.search.store import TrialStore

    root = init_host(tmp_path / "h200", "h200", seed=2, os_tree=False)
    rc, out, err = run_cli(capsys, "--sim-root", str(root), "search", "mixed", "--workload",
                           workload, "--knob", "none", "--family", "rmsnorm", "--no-runtime",
                           "--proposer", "grid", "--budget", "1", "--max-choices", "3",
                           "--rounds", "1", "--repeats", "2", "--policy", POLICY, "--json")
    assert rc == 0, err[-3000:]
    res = json.loads(out)
    with TrialStore.in_state_dir(tmp_path / "state") as st:
        trials = st.list(run_id=res["run_id"])
    return res, trials


def _variants(trials) -> list:
    return [k.variant for t in trials for k in t.candidate.kernels]


@pytest.mark.usefixtures("cli_env")
def test_a_workload_registered_with_model_process_tries_the_stored_source(
        capsys, tmp_path, registry):
    sha = _store_source(tmp_path / "state")
    res, trials = _search(capsys, tmp_path, registry.NAME)
    assert f"src:{sha}" in _variants(trials), (res, _variants(trials))
    (t,) = trials  # grid, budget 1: each slot's middle choice (torch, the source, a config)
    assert {k.variant for k in t.candidate.kernels} == {f"src:{sha}"}, t.candidate
    assert all(v["code"] == "accepted" for v in t.measurements["kernels"].values()), t.gates
    assert "holistic" in t.measurements, t.reason  # measured in the model process
    assert not any("stored kernel sources" in n for n in res["notes"]), res["notes"]


@pytest.mark.usefixtures("cli_env")
def test_a_workload_registered_without_model_process_is_never_offered_stored_sources(
        capsys, tmp_path, registry):
    from tuner.workloads.factory import register

    register("tiny-here", registry.build, "tiny-here (tests)")  # no model_process
    sha = _store_source(tmp_path / "state")
    res, trials = _search(capsys, tmp_path, "tiny-here")
    assert f"src:{sha}" not in _variants(trials), _variants(trials)
    assert any("stored kernel sources not tried: llama runs in the search's process" in n
               for n in res["notes"]), res["notes"]
    assert res["slots"], res  # its kernel calls are still slots (shipped variants)
