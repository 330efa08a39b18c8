"""What the kernel canary sees of calls made under torch.compile and CUDA graphs (issue 24).

- torch.compile (fullgraph): the op `torch.ops.metaltune.<family>` is opaque to the compiler;
  tracing runs its fake implementation (no kernel, no canary), and every call of the compiled
  function runs the real op, i.e. `dispatch.call`, eagerly: the canary samples those calls as
  any other, and a source that goes wrong inside a compiled model is caught, removed and the
  compiled function keeps running on the fallback, with no recompilation.
- CUDA graph capture: a call made while the current stream captures is never replayed (a replay
  synchronises, which capture forbids); the replay is left to the entry's next eager call. A
  graph replay runs no Python at all, so its calls are not seen by the canary: a decode that
  only ever replays a captured graph is re-verified only by its eager calls (prefill, a
  recapture). That test needs a GPU (skipped here without one)."""
from __future__ import annotations


import pytest
import torch

from kernelsearch import dispatch
from kernelsearch.store import SourceStore, environment
from kernelsearch.table import DispatchTable, Entry
from tests.kernelsearch.canary_helpers import go_wrong
from tests.kernelsearch.test_store import ACCEPTED, SRC

COLS = 64


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("KERNELSEARCH_CANARY_RATE", "0.5")
    yield
    dispatch.install(None)
    dispatch._incidents.clear()  # the process's record: the next test starts with none


def _install(tmp_path, device: str) -> str:
    st = SourceStore(tmp_path / "sources")
    sha = st.put("rmsnorm", SRC, {}, ACCEPTED, env=environment(device)).sha256
    dispatch.install(DispatchTable([Entry("rmsnorm", "float32", {"cols": COLS},
                                          {"rows": [1, 4096]}, f"src:{sha}", {})],
                                   device=device), store=st.root)
    assert dispatch.refused() == {}
    return sha


def _ref(x, w, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def test_a_compiled_model_is_sampled_and_falls_back_without_recompiling(tmp_path):
    import kernelsearch.ops as ops
    from torch._dynamo.testing import CompileCounter

    ops.register_all()
    sha = _install(tmp_path, "cpu")
    counter = CompileCounter()
    f = torch.compile(lambda x, w: torch.ops.metaltune.rmsnorm(x, w, 1e-6) + 0.0,
                      backend=counter, fullgraph=True)
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(4, COLS, generator=g), torch.randn(COLS, generator=g)
    seen = len(dispatch.incidents())
    r0, k0 = dispatch.canary_stats()["replays"], dispatch.stats()["kernel"]
    for _ in range(4):
        torch.testing.assert_close(f(x, w), _ref(x, w), atol=1e-4, rtol=1e-4)
    assert dispatch.stats()["kernel"] - k0 == 4  # every compiled call ran the table's kernel
    assert dispatch.canary_stats()["replays"] - r0 >= 2  # and the canary sampled them
    undo = go_wrong()
    try:
        for _ in range(8):
            out = f(x, w)
            torch.testing.assert_close(out, _ref(x, w), atol=1e-4, rtol=1e-4)  # never wrong
            if dispatch.incidents()[seen:]:
                break
        else:
            pytest.fail("the canary never replayed a compiled call")
        (inc,) = dispatch.incidents()[seen:]
        assert inc["source_sha256"] == sha and dispatch.installed().entries == []
        f0 = dispatch.stats()["fallback"]
        torch.testing.assert_close(f(x, w), _ref(x, w), atol=1e-4, rtol=1e-4)
        assert dispatch.stats()["fallback"] == f0 + 1
    finally:
        undo()
    assert counter.frame_count == 1  # one compile: the fallback is the op's own business


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graph capture needs a GPU")
def test_no_replay_during_capture_and_graph_replays_are_not_seen(tmp_path, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET")
    import kernelsearch.ops as ops

    ops.register_all()
    _install(tmp_path, "cuda")
    x = torch.randn(4, COLS, device="cuda")
    w = torch.randn(COLS, device="cuda")
    torch.ops.metaltune.rmsnorm(x, w, 1e-6)  # eager: the first call, replayed
    torch.cuda.synchronize()
    r0 = dispatch.canary_stats()["replays"]
    graph = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):  # warm-up on the side stream, eager
            torch.ops.metaltune.rmsnorm(x, w, 1e-6)
    torch.cuda.current_stream().wait_stream(s)
    r1 = dispatch.canary_stats()["replays"]
    k1 = dispatch.stats()["kernel"]
    with torch.cuda.graph(graph):
        for _ in range(8):  # every one due at rate 1/2: none replayed while capturing
            out = torch.ops.metaltune.rmsnorm(x, w, 1e-6)
    assert dispatch.canary_stats()["replays"] == r1
    assert dispatch.stats()["kernel"] == k1 + 8
    for _ in range(4):
        graph.replay()  # no Python runs: neither dispatch nor the canary sees these
    torch.cuda.synchronize()
    assert dispatch.stats()["kernel"] == k1 + 8 and dispatch.canary_stats()["replays"] == r1
    torch.testing.assert_close(out, _ref(x, w), atol=1e-3, rtol=1e-3)
    torch.ops.metaltune.rmsnorm(x, w, 1e-6)  # the next eager call takes the deferred replay
    assert dispatch.canary_stats()["replays"] == r1 + 1
    assert r1 >= r0
