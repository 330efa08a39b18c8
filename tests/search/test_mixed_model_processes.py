"""What is judged is what runs: a model process never serves two tables whose sets of stored
sources differ (tuner.workloads.model_process), so whatever a candidate's stored source leaves
behind once imported cannot bias the incumbent's side of the A/B, nor the next trial's. Real
model processes throughout (the tiny Llama, confined as in a search)."""
from __future__ import annotations

import os
import signal

import pytest

from tests.search.test_mixed_model_process import GOOD, _zombie
from tests.search.test_mixed_search import POLICY, interp  # noqa: F401 (fixture)
from tuner.sim.hostinit import init_host


def _stored(root, n: int) -> list[tuple[str, str]]:
    """n accepted stored rmsnorm sources, each its own digest: (sha256, module name)."""
    from kernelsearch.harness.sandbox import module_name
    from kernelsearch.store import SourceStore, environment

    store = SourceStore(root)
    out = []
    for i in range(n):
        text = GOOD["source"] + f"\n# variant {i}\n"
        sha = store.put("rmsnorm", text, GOOD["config"], {"verdict": "accepted",
                                                          "code": "accepted"},
                        env=environment("cpu")).sha256
        out.append((sha, module_name(text)))
    return out


def _table(variant: str, config: dict):
    from kernelsearch.table import DispatchTable, Entry

    return DispatchTable([Entry("rmsnorm", "float32", {"cols": 64}, {"rows": [1, 64]}, variant,
                                dict(config))])


def _src(sha: str):
    return _table(f"src:{sha}", GOOD["config"])


def _gone(pid: int) -> bool:
    return not os.path.exists(f"/proc/{pid}") or _zombie(pid)


@pytest.fixture
def model(interp):  # noqa: F811
    from tuner.sim.llama_host import LLAMA_KW
    from tuner.workloads.model_process import ModelWorkload, Recipe

    wl = ModelWorkload(Recipe(llama=dict(LLAMA_KW), threads=1, timeout_s=60.0))
    yield wl
    pids = list(wl.pids().values())
    wl.close()
    assert wl.pids() == {} and all(_gone(p) for p in pids)  # close() closes every one


def test_the_incumbent_is_never_measured_where_a_candidate_source_was_imported(tmp_path,
                                                                              interp):  # noqa: F811
    """One search trial whose candidate names a stored source (judged and accepted): its side
    is measured in another process than the incumbent's, which has no stored source's module
    loaded before the candidate was measured nor after."""
    from kernelsearch.store import SourceStore
    from tests.search.helpers import Scripted
    from tuner.host import open_host
    from tuner.search import loop
    from tuner.search.mixed.run import build_evaluator, make_mixed_workload
    from tuner.search.mixed.space import kernel_slots, label, stored_sources
    from tuner.search.safety_context import SafetyContext
    from tuner.search.store import TrialStore
    from tuner.trial import Candidate

    ((sha, module),) = _stored(tmp_path / "state" / "kernels" / "sources", 1)
    store = SourceStore(tmp_path / "state" / "kernels" / "sources")
    host = open_host("sim", init_host(tmp_path / "h200", "h200", seed=2, os_tree=False))
    wl = make_mixed_workload(host, "sim-llama", None, 600.0)
    named: list[list[str]] = [[]]  # the sources of the table installed last
    seen: list[tuple[list[str], int, list[str]]] = []  # (its sources, pid, modules there)
    real_install, real_measure = wl.llama.install_table, wl.llama.measure

    def install_table(table, store_dir=None):
        named[0] = list(table.sources())
        real_install(table, store_dir)

    def measure(repeats=5, timeout_s=None):
        m = real_measure(repeats, timeout_s)
        mp = m.extra["model_process"]
        seen.append((named[0], mp["pid"], mp["sources"]))
        return m

    wl.llama.install_table, wl.llama.measure = install_table, measure
    slots = kernel_slots(wl.kernel_calls(), ["rmsnorm"], max_choices=3,
                         sources=stored_sources(store))
    slot = next(s for s in slots if s.shape == (1, 64))
    guard = SafetyContext(host, tmp_path / "state", policy=POLICY)
    try:
        ev = build_evaluator({}, wl, guard, {}, slots, rounds=1, repeats=1, store_dir=store.root)
        old = ev.incumbent_table()
        ev.measure_incumbent()
        with TrialStore.in_state_dir(tmp_path / "state") as ts:
            (t,) = loop.run(Scripted(ev.joint.space, [Candidate(kernels=[
                slot.choice(label(f"src:{sha}", GOOD["config"]))])]),
                ev, ts, ts.new_run("search-mixed", {}), 1).trials
        wl.llama.install_table(old, store.root)  # the old incumbent's, whichever the verdict
        wl.measure(repeats=1)
        after = wl.llama.stats()
    finally:
        guard.close()
        wl.close()
    assert t.measurements["kernels"][slot.name]["code"] == "accepted", t.gates
    assert t.verdict in ("kept", "reverted") and "holistic" in t.measurements, t.gates
    inc = [(pid, mods) for srcs, pid, mods in seen if srcs == []]
    cand = [(pid, mods) for srcs, pid, mods in seen if srcs == [sha]]
    assert len(inc) + len(cand) == len(seen) and cand, seen
    first = next(i for i, (srcs, _, _) in enumerate(seen) if srcs)
    assert seen[0][0] == [] and seen[-1][0] == [] and first > 0, seen  # before and after
    (inc_pid,) = {pid for pid, _ in inc}
    assert all(mods == [] for _, mods in inc), seen
    assert all(pid != inc_pid and module in mods for pid, mods in cand), seen
    assert after["pid"] == inc_pid and after["sources"] == [], after


def test_tables_of_shipped_variants_share_one_process(tmp_path, model):
    """Shipped code is trusted: tables naming only shipped variants, or none, are all served
    by the first process; a stored source's table gets another, and the shipped one stays."""
    ((sha, module),) = _stored(tmp_path / "store", 1)
    p0 = model.pid
    model.install_table(_table("row", {"ROWS": 1, "num_warps": 1}))
    assert model.stats()["pid"] == p0
    model.install_table(_table("looped", {"BLOCK": 128, "STAGES": 1, "num_warps": 4}))
    m = model.measure(repeats=1, timeout_s=60.0)
    assert m.extra["model_process"]["pid"] == p0 and m.extra["model_process"]["sources"] == []
    assert model.pids() == {frozenset(): p0}
    model.install_table(_src(sha), tmp_path / "store")
    got = model.stats()
    assert got["pid"] != p0 and got["sources"] == [module], got
    model.install_table(_table("row", {"ROWS": 1, "num_warps": 2}))
    got = model.stats()
    assert got["pid"] == p0 and got["sources"] == [], got
    assert model.pids() == {frozenset(): p0, frozenset([sha]): model.pids()[frozenset([sha])]}


def test_at_most_two_processes_the_incumbents_and_the_candidates(tmp_path, model):
    """Candidates with different sources, each installed after the incumbent (as the evaluator
    does): each in a fresh process with its own source only, the previous candidate's closed,
    the incumbent's the same throughout. A kept candidate's process becomes the incumbent's."""
    srcs = _stored(tmp_path / "store", 4)
    p0, pids = model.pid, []
    for sha, module in srcs[:3]:
        model.install_table(_src(sha), tmp_path / "store")
        got = model.stats()
        assert got["sources"] == [module] and got["pid"] not in pids + [p0], (got, pids)
        pids.append(got["pid"])
        assert model.pids() == {frozenset(): p0, frozenset([sha]): got["pid"]}
        assert all(_gone(p) for p in pids[:-1]), pids  # the earlier candidates' are ended
        model.install_table(_table("row", {"ROWS": 1, "num_warps": 1}))
        got = model.stats()
        assert got["pid"] == p0 and got["sources"] == [], got
    # the third candidate kept: the next is installed after it, and the old incumbent's goes
    model.install_table(_src(srcs[2][0]), tmp_path / "store")
    model.install_table(_src(srcs[3][0]), tmp_path / "store")
    got = model.stats()
    assert got["sources"] == [srcs[3][1]] and got["pid"] not in pids + [p0], got
    assert _gone(p0) and set(model.pids()) == {frozenset([srcs[2][0]]), frozenset([srcs[3][0]])}
    model.install_table(_src(srcs[2][0]), tmp_path / "store")
    assert model.stats()["pid"] == pids[2]


def test_a_killed_candidate_process_is_model_crashed_and_only_its_set_restarts(tmp_path,
                                                                              model):
    """The candidate's process killed: its measurement is model_crashed; the next request for
    that set gets a fresh process (its source installed again), the incumbent's is untouched."""
    from tuner.workloads.model_process import ModelProcessFailed

    ((sha, module),) = _stored(tmp_path / "store", 1)
    p0 = model.pid
    assert model.measure(repeats=1, timeout_s=60.0).extra["model_process"]["pid"] == p0
    model.install_table(_src(sha), tmp_path / "store")
    m = model.measure(repeats=1, timeout_s=60.0)
    killed = m.extra["model_process"]["pid"]
    assert killed != p0 and m.extra["model_process"]["sources"] == [module]
    os.kill(killed, signal.SIGKILL)
    with pytest.raises(ModelProcessFailed) as e:
        model.measure(repeats=1, timeout_s=60.0)
    assert e.value.code == "model_crashed" and "SIGKILL" in str(e.value), e.value
    assert model.pid is None and model.pids() == {frozenset(): p0}
    m = model.measure(repeats=1, timeout_s=60.0)
    fresh = m.extra["model_process"]["pid"]
    assert fresh not in (killed, p0) and m.extra["model_process"]["sources"] == [module]
    model.install_table(_table("row", {"ROWS": 1, "num_warps": 1}))
    got = model.stats()
    assert got["pid"] == p0 and got["sources"] == [], got
