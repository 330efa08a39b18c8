"""The kernel canary keeps installed kernels verified in use: a stored source installed through
dispatch and run by a patched tiny Llama (CPU, Triton interpreter) that starts computing wrong
after N calls (its kernel launch is swapped for one that doubles the output, as a guard hole or
a silent device fault would) is caught by a sampled replay against the family's reference,
its entry removed, an incident recorded naming its digest, the source quarantined in its store
(never installed again), and the model keeps running on the fallback with the plain model's
logits."""
from __future__ import annotations


import pytest
import torch

from kernelsearch import canary, dispatch
from kernelsearch.integrations import transformers as mt
from kernelsearch.store import SourceStore, environment
from kernelsearch.table import DispatchTable, Entry
from tests.kernelsearch.canary_helpers import go_wrong
from tests.kernelsearch.test_store import ACCEPTED, SRC
from tuner.workloads.hf import HFModel

N = 24  # calls before it goes wrong


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    yield
    dispatch.install(None)
    dispatch._incidents.clear()  # the process's record: the next test starts with none


def _logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


def test_a_source_that_goes_wrong_in_use_is_caught_removed_and_quarantined(tmp_path, monkeypatch):
    monkeypatch.setenv(canary.RATE_ENV, "0.125")
    m = HFModel("tiny-llama")
    model = m.model
    ids = torch.randint(3, 256, (1, 6), generator=torch.Generator().manual_seed(0))
    plain = _logits(model, ids)
    st = SourceStore(tmp_path / "sources")
    sha = st.put("rmsnorm", SRC, {}, ACCEPTED, env=environment("cpu")).sha256
    table = DispatchTable([Entry("rmsnorm", "float32", {"cols": m.config.hidden_size},
                                 {"rows": [1, 4096]}, f"src:{sha}", {})], device="cpu")
    dispatch.install(table, store=st.root)
    assert dispatch.refused() == {}
    seen = []
    canary.add_listener(seen.append)
    try:
        mt.patch(model)
        calls = 0
        while calls < N:  # honest for N calls: replayed, and agreeing
            s0 = dispatch.stats()["kernel"]
            assert torch.allclose(_logits(model, ids), plain, atol=1e-4)
            calls += dispatch.stats()["kernel"] - s0
        assert dispatch.incidents() == [] and dispatch.canary_stats()["replays"] >= 2
        go_wrong()  # from now on the launch writes twice the right answer
        for _ in range(8):  # at most 1/rate calls later it is caught
            _logits(model, ids)
            if dispatch.incidents():
                break
        (inc,) = dispatch.incidents()
        assert inc["kind"] == "canary_failure" and inc["source_sha256"] == sha
        assert inc["family"] == "rmsnorm" and "tolerance" in inc["detail"]
        assert seen == [inc]
        assert dispatch.installed().entries == []  # its entry is gone
        assert "kernel canary" in dispatch.refused()[sha]
        rec = st.record(sha)
        assert rec.quarantined and "kernel canary" in rec.quarantined["why"]
        # the model keeps running, on the fallback, with the plain model's logits
        s0 = dispatch.stats()
        assert torch.allclose(_logits(model, ids), plain, atol=1e-4)
        s1 = dispatch.stats()
        assert s1["kernel"] == s0["kernel"] and s1["fallback"] > s0["fallback"]
        # and the source is never installed again
        dispatch.install(table, store=st.root)
        assert "quarantined" in dispatch.refused()[sha]
    finally:
        if seen.append in canary.listeners:
            canary.listeners.remove(seen.append)
        mt.unpatch(model)


def test_bad_canary_settings_are_refused_by_name(monkeypatch):
    monkeypatch.setenv(canary.RATE_ENV, "often")
    with pytest.raises(ValueError, match="KERNELSEARCH_CANARY_RATE='often'"):
        dispatch.install(None)
    monkeypatch.delenv(canary.RATE_ENV)
