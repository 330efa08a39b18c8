"""A candidate whose run fails on the device (a CUDA graph capture it breaks, an out-of-memory)
is a rejected trial; the search goes on from the same incumbent."""
from __future__ import annotations

import pytest

from tests.search.test_mixed_search import POLICY, interp  # noqa: F401  (fixture)
from tuner.sim.hostinit import init_host


@pytest.mark.usefixtures("interp")
def test_a_candidate_runtime_whose_capture_fails_is_rejected_and_the_search_goes_on(tmp_path,
                                                                                    monkeypatch):
    from tests.search.helpers import Scripted
    from tuner.host import open_host
    from tuner.search import loop
    from tuner.search.mixed.run import build_evaluator
    from tuner.search.mixed.space import RUNTIME_DIMS
    from tuner.search.safety_context import SafetyContext
    from tuner.search.store import TrialStore
    from tuner.sim.llama_host import SimHostLlamaWorkload
    from tuner.trial import Candidate
    from tuner.workloads import llama

    prepare = llama.DecodeRunner.prepare

    def breaks_when_fused(self, *a, **kw):
        """What the H200 did: the decode step's capture failed under fused projections (the
        error torch raises there, at the one place a capture happens)."""
        if self.rt.fuse_projections:
            raise RuntimeError("CUDA error: operation failed due to a previous error during "
                               "capture\nSearch for `cudaErrorStreamCaptureInvalidated'")
        return prepare(self, *a, **kw)

    monkeypatch.setattr(llama.DecodeRunner, "prepare", breaks_when_fused)

    root = init_host(tmp_path / "h200", "h200", seed=2, os_tree=False)
    wl = SimHostLlamaWorkload(root)
    guard = SafetyContext(open_host("sim", root), tmp_path / "state", policy=POLICY)
    try:
        ev = build_evaluator({}, wl, guard, RUNTIME_DIMS, [], rounds=1, repeats=1)
        start = dict(ev.joint.incumbent.runtime)
        ev.measure_incumbent()
        cands = [Candidate(runtime={"fuse_projections": True}),
                 Candidate(runtime={"attn_impl": "split_kv"})]
        with TrialStore.in_state_dir(tmp_path / "state") as store:
            trials = loop.run(Scripted(ev.joint.space, cands), ev, store,
                              store.new_run("search-mixed", {}), 2).trials
    finally:
        guard.close()
    broken, next_one = trials
    assert (broken.verdict, broken.reason) == ("rejected", "measure_failed"), broken.gates
    assert "cudaErrorStreamCaptureInvalidated" not in broken.gates[-1].detail  # one line
    assert "operation failed due to a previous error during capture" in broken.gates[-1].detail
    assert ev.joint.incumbent.runtime == start and wl.llama.runtime.fuse_projections is False
    # the next candidate is measured end to end against the same incumbent
    assert "holistic" in next_one.measurements and next_one.verdict in ("kept", "reverted")
