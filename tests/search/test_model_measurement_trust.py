"""A model process that reports tokens/s its run did not make is not believed (issue 33, item
3). The process runs candidate code, so its reply can say anything: a candidate far slower than
the incumbent that reported 1.5x the rates it measured was kept. The search now checks every
measurement against its own clock of the request (tuner.workloads.model_trust): a reply that
disagrees is the trial's `measurement_untrusted`, never kept."""
from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

from tests.search.test_mixed_search import POLICY, interp  # noqa: F401 (fixture)
from tuner.sim.hostinit import init_host

# on the model process's path: with fused projections (the candidate's runtime) every
# measurement takes seconds longer than its samples say, and reports 1.5x the measured rates
FORGER = """
import os, sys, time
if any(a.endswith("model_server") for a in sys.orig_argv):
    import tuner.workloads.llama_runners as lr
    real = lr.Bench.run
    def run(self, rt, *a, **k):
        res = real(self, rt, *a, **k)
        if getattr(rt, "fuse_projections", False):
            time.sleep(4.0)  # what the candidate really costs: 100x the incumbent's run
            res["per_size_samples"] = {key: [v * 1.5 for v in vals]
                                       for key, vals in res["per_size_samples"].items()}
        return res
    lr.Bench.run = run
"""


def test_a_model_process_forging_its_tokens_per_s_is_untrusted_not_kept(tmp_path, interp,
                                                                       monkeypatch):  # noqa: F811
    from tests.search.helpers import Scripted
    from tests.simhelpers import REPO
    from tuner.host import open_host
    from tuner.search import loop
    from tuner.search.mixed.run import build_evaluator, make_mixed_workload
    from tuner.search.safety_context import SafetyContext
    from tuner.search.store import TrialStore
    from tuner.trial import Candidate

    site = Path(tempfile.mkdtemp(prefix="h33-forge-", dir="/tmp"))  # readable by the sandbox
    os.chmod(site, 0o755)  # user, writable by root only
    try:
        (site / "sitecustomize.py").write_text(FORGER)
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), str(REPO)]))
        root = init_host(tmp_path / "h200", "h200", seed=2, os_tree=False)
        host = open_host("sim", root)
        wl = make_mixed_workload(host, "sim-llama", None, 60.0)
        guard = SafetyContext(host, tmp_path / "state", policy=POLICY)
        try:
            ev = build_evaluator({}, wl, guard, {"fuse_projections": [False, True],
                                                  "cuda_graphs": [True, False]}, [],
                                 rounds=1, repeats=3, timeout_s=30.0)
            ev.measure_incumbent()  # honest: believed
            with TrialStore.in_state_dir(tmp_path / "state") as ts:
                forged, honest = loop.run(Scripted(ev.joint.space, [
                    Candidate(runtime={"fuse_projections": True}),
                    Candidate(runtime={"cuda_graphs": False})]),
                    ev, ts, ts.new_run("search-mixed", {}), 2).trials
        finally:
            guard.close()
            wl.close()
    finally:
        subprocess.run(["rm", "-rf", str(site)])
    assert (forged.verdict, forged.reason) == ("rejected", "measurement_untrusted"), \
        (forged.verdict, forged.reason, forged.gain, [g.detail for g in forged.gates])
    assert "search's clock" in forged.gates[-1].detail
    # an honest candidate's measurements agree with the clock: judged on its numbers
    assert honest.verdict in ("kept", "reverted") and honest.reason != "measurement_untrusted", \
        (honest.reason, [g.detail for g in honest.gates])


# issue 42, item 1: with fused projections the candidate's samples take 100x the incumbent's,
# and the process reports every sample but the first at 200x its rate (2x the incumbent's) and
# puts the rest of the time into the first: the total matches the parent's clock, the medians
# are forged (on main at 5a20295 it was kept: improved)
OUTLIER = """
import sys, time
if any(a.endswith("model_server") for a in sys.orig_argv):
    import tuner.workloads.llama_runners as lr
    real = lr.time_sizes
    def time_sizes(bench, rt, sizes, repeats, deadline):
        if not getattr(rt, "fuse_projections", False):
            return real(bench, rt, sizes, repeats, deadline)
        runner = bench.runner
        def slowed(*a, **k):
            r = runner(*a, **k)
            if not getattr(r, "slowed", False):
                fast = r.tokens_per_s
                def tokens_per_s(steps=1):
                    t0 = time.perf_counter()
                    rate = fast(steps)
                    time.sleep(99 * (time.perf_counter() - t0))  # the candidate's kernels
                    return rate / 100
                r.tokens_per_s, r.slowed = tokens_per_s, True
            return r
        bench.runner = slowed
        try:
            res = real(bench, rt, sizes, repeats, deadline)
        finally:
            del bench.runner
        for key, vals in res["per_size_samples"].items():
            forged = [v * 200 for v in vals[1:]]
            rest = sum(1 / v for v in vals) - sum(1 / v for v in forged)
            res["per_size_samples"][key] = [1 / rest] + forged
        return res
    lr.time_sizes = time_sizes
"""


def _search_with(site_code: str, tmp_path, monkeypatch, candidates: list,
                 repeats: int = 5) -> list:
    """The trials of a mixed search on the simulated host whose model processes run
    `site_code` (a sitecustomize.py) first."""
    from tests.search.helpers import Scripted
    from tests.simhelpers import REPO
    from tuner.host import open_host
    from tuner.search import loop
    from tuner.search.mixed.run import build_evaluator, make_mixed_workload
    from tuner.search.safety_context import SafetyContext
    from tuner.search.store import TrialStore

    site = Path(tempfile.mkdtemp(prefix="h42-forge-", dir="/tmp"))  # readable by the sandbox
    os.chmod(site, 0o755)  # user, writable by root only
    try:
        (site / "sitecustomize.py").write_text(site_code)
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), str(REPO)]))
        root = init_host(tmp_path / "h200", "h200", seed=2, os_tree=False)
        host = open_host("sim", root)
        wl = make_mixed_workload(host, "sim-llama", None, 60.0)
        guard = SafetyContext(host, tmp_path / "state", policy=POLICY)
        try:
            ev = build_evaluator({}, wl, guard, {"fuse_projections": [False, True],
                                                  "cuda_graphs": [True, False]}, [],
                                 rounds=1, repeats=repeats, timeout_s=30.0)
            ev.measure_incumbent()
            with TrialStore.in_state_dir(tmp_path / "state") as ts:
                return loop.run(Scripted(ev.joint.space, candidates), ev, ts,
                                ts.new_run("search-mixed", {}), len(candidates)).trials
        finally:
            guard.close()
            wl.close()
    finally:
        subprocess.run(["rm", "-rf", str(site)])


def test_a_forged_median_with_one_slow_outlier_is_not_kept(tmp_path, interp,
                                                           monkeypatch):  # noqa: F811
    """The total matches the parent's clock, but the parent times every sample itself: the
    forgery is untrusted (its slow sample says longer than its window), never kept; an honest
    candidate is judged on the parent's numbers, which its report agrees with."""
    from tuner.trial import Candidate

    forged, honest = _search_with(OUTLIER, tmp_path, monkeypatch, [
        Candidate(runtime={"fuse_projections": True}), Candidate(runtime={"cuda_graphs": False})])
    assert forged.verdict != "kept" and forged.reason == "measurement_untrusted", \
        (forged.verdict, forged.reason, forged.gain, [g.detail for g in forged.gates])
    assert "search's clock" in forged.gates[-1].detail
    assert honest.verdict in ("kept", "reverted") and honest.reason != "measurement_untrusted", \
        (honest.reason, [g.detail for g in honest.gates])
    assert honest.objective and honest.objective > 0, honest


def test_the_kept_numbers_are_the_parents_and_the_report_is_checked_against_them():
    import pytest

    from tuner.trial import Measurement
    from tuner.workloads import model_trust

    timing = {"decode_steps": 2, "sizes": [["decode", 1, 8]]}  # 2 tokens a sample
    clock = model_trust.SampleClock()
    clock.mark({"mark": "decode@ctx8,b1", "rate": None}, 0.0)
    t = 0.0
    for dt in (1.0, 1.0, 1.0):  # the parent saw three 1 s samples: 2 tok/s
        clock.went(t)
        t += dt
        clock.mark({"mark": "decode@ctx8,b1", "rate": 1.0}, t)

    def reported(rates):
        return Measurement(metric="tokens_per_s", unit="tok/s", value=max(rates),
                           extra={"per_size_samples": {"decode@ctx8,b1": rates}, "device": "cpu"})

    honest = model_trust.judge(reported([2.1, 2.2, 2.05]), clock, 3.2, timing, "cpu")
    assert honest.per_size == {"decode@ctx8,b1": pytest.approx(2.0)}
    assert honest.value == pytest.approx(2.0) and honest.extra["device"] == "cpu"
    assert honest.extra["reported_per_size_samples"] == {"decode@ctx8,b1": [2.1, 2.2, 2.05]}
    # the outlier forgery: two samples at 50x, the rest of the 3 s in one
    with pytest.raises(model_trust.Untrusted, match="took .* but the search's clock saw"):
        model_trust.judge(reported([2 / (3 - 2 * 0.01), 100.0, 100.0]), clock, 3.2, timing,
                          "cpu")
    with pytest.raises(model_trust.Untrusted, match="reports 100 tok/s"):
        model_trust.judge(reported([100.0, 100.0, 100.0]), clock, 3.2, timing, "cpu")
    with pytest.raises(model_trust.Untrusted, match="timed 3"):
        model_trust.judge(reported([2.0, 2.0]), clock, 3.2, timing, "cpu")
    with pytest.raises(model_trust.Untrusted, match="account for"):  # work between samples
        model_trust.judge(reported([2.0, 2.0, 2.0]), clock, 30.0, timing, "cpu")


def test_what_a_reply_implies_is_checked_against_the_clock_both_ways():
    import pytest

    from tuner.trial import Measurement
    from tuner.workloads import model_trust

    timing = {"decode_steps": 3, "sizes": [["decode", 2, 16], ["prefill", 1, 16]]}
    # decode: 2 x 3 tokens per sample at 6 tok/s = 1 s; prefill: 16 tokens at 16 tok/s = 1 s
    m = Measurement(metric="t", value=1.0, extra={"per_size_samples": {
        "decode@ctx16,b2": [6.0, 6.0], "prefill@ctx16,b1": [16.0, 16.0]}})
    assert model_trust.implied_seconds(m.extra["per_size_samples"], timing) == (4.0, 2.0 / 6 + 1)
    model_trust.check(m, 4.5, timing, "cpu")  # honest: 0.5 s of overhead
    with pytest.raises(model_trust.Untrusted, match="account for"):
        model_trust.check(m, 40.0, timing, "cpu")  # 10x slower than it says
    with pytest.raises(model_trust.Untrusted, match="but the request took"):
        model_trust.check(m, 1.0, timing, "cpu")  # more time than passed
    bad = Measurement(metric="t", value=1.0, extra={"per_size_samples": {"decode@ctx99,b2": [1]}})
    with pytest.raises(model_trust.Untrusted, match="not one it was asked"):
        model_trust.check(bad, 1.0, timing, "cpu")
