"""A trial whose A/B outlasts the probation grace is judged, not rolled back while it is being
measured (the H200 product loop lost its first trial so: a 47 s compiled A/B, a 30 s grace). The
real loop and evaluators on a simulated H200; the grace is shortened and the workload slowed so
the measurement takes several graces."""
from __future__ import annotations

import time

import pytest

from tests.search.test_mixed_search import POLICY, interp  # noqa: F401  (fixture)
from tuner.sim.hostinit import init_host

GRACE_S = 0.4
SAMPLE_S = 0.5  # every measurement sleeps this long on top of the real (tiny Llama) run


def _slow(cls):
    class Slow(cls):
        def measure(self, *a, **kw):
            time.sleep(SAMPLE_S)
            return super().measure(*a, **kw)

    return Slow


def _run(tmp_path, knobs_of, cands, probation_s=None, measure_timeout_s=None, rounds=2):
    from tests.search.helpers import Scripted
    from tuner.host import open_host
    from tuner.knobs import gpu
    from tuner.search import loop
    from tuner.search.mixed.run import build_evaluator
    from tuner.search.mixed.space import RUNTIME_DIMS
    from tuner.search.safety_context import SafetyContext
    from tuner.search.store import TrialStore
    from tuner.sim.llama_host import SimHostLlamaWorkload

    root = init_host(tmp_path / "h200", "h200", seed=2, os_tree=False)
    host = open_host("sim", root)
    knobs = {k.name: k for k in gpu.discover(host) if k.name in knobs_of}
    wl = _slow(SimHostLlamaWorkload)(root)
    guard = SafetyContext(host, tmp_path / "state", policy=POLICY, probation_s=probation_s,
                          measure_timeout_s=measure_timeout_s)
    try:
        ev = build_evaluator(knobs, wl, guard, RUNTIME_DIMS, [], rounds=rounds, repeats=1)
        ev.measure_incumbent()
        t0 = time.monotonic()
        with TrialStore.in_state_dir(tmp_path / "state") as store:
            trials = loop.run(Scripted(ev.joint.space, cands), ev, store,
                              store.new_run("search-mixed", {}), len(cands)).trials
        took = time.monotonic() - t0
    finally:
        guard.close()
    return trials, took


@pytest.mark.usefixtures("interp")
def test_a_trial_with_no_host_change_is_judged_however_long_its_ab_takes(tmp_path, monkeypatch):
    from safety import transaction
    from tuner.trial import Candidate

    monkeypatch.setattr(transaction, "NO_PROBATION_GRACE_S", GRACE_S)
    (t,), took = _run(tmp_path, (), [Candidate(runtime={"attn_impl": "split_kv"})])
    # the A/B outlasted the grace more than twice: at least one pair of slow samples (1.0 s),
    # as a clear loser stops after a pair, else two (4 samples)
    assert took > 2 * GRACE_S
    assert t.verdict in ("kept", "reverted"), (t.verdict, t.reason, t.gates)
    assert "probation_expired" not in (t.reason or "")
    assert "holistic" in t.measurements


@pytest.mark.usefixtures("interp")
def test_a_host_change_measured_longer_than_its_probation_is_judged_and_kept_alive(tmp_path,
                                                                                 monkeypatch):
    """With a host change there is something to undo: the watchdog keeps its deadline, but the
    caller's checks after each sample move it on while the measurement goes on."""
    from safety import transaction
    from tuner.trial import Candidate

    monkeypatch.setattr(transaction, "NO_PROBATION_GRACE_S", GRACE_S)
    cand = Candidate(knobs={"gpu0.power_limit_w": 600})
    (t,), took = _run(tmp_path, ("gpu0.power_limit_w",), [cand], probation_s=0,
                         measure_timeout_s=SAMPLE_S + 1.0)
    assert took > 2 * GRACE_S  # one pair of slow samples at least, as above
    assert t.verdict in ("kept", "reverted"), (t.verdict, t.reason, t.gates)
    assert "probation_expired" not in (t.reason or "")
