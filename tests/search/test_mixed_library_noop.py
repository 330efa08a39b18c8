"""A mixed-search slot never offers two choices that run the same kernel: where no entry covers
a call, dispatch already runs the best installed library kernel offered at its shape
(kernelsearch.table.FALLBACK), so an explicit entry for that library there is the same as no
entry, and an A/B between them measures nothing. The library is still offered where it replaces
something (the incumbent runs a Triton kernel there).

A STAND-IN flash_mla package (tests/kernelsearch/test_libraries.py's) makes FlashMLA found on
the CPU; the judge's records are written into the evaluator's verdict cache, as the library
yardstick tests do; the A/B and the keep rule are the real ones, on a stand-in workload."""
from __future__ import annotations

import pytest

from tests.kernelsearch.test_libraries import _fresh, flash_mla  # noqa: F401  (fixtures)
from tests.search.test_library_yardstick_mixed import _judged
from tests.search.test_mixed_search import POLICY
from tuner.sim.hostinit import init_host

SHAPE = (2, 16, 130, 64, 1)  # a decode FlashMLA takes (64-token pages, 16 heads)
CALLS = [("mla_decode", "bfloat16", SHAPE)]
LIB = "flashmla{}"
SPLITKV = {"BLOCK_H": 16, "BLOCK_N": 16, "GRID": 132, "STAGES": 1, "num_warps": 4}


def _table(variant, config, shape=SHAPE, **fields):
    """A one-entry table for `shape`; `fields`: the entry's measured ones (speedup_vs_library)."""
    from kernelsearch.families import get
    from kernelsearch.table import DispatchTable, Entry

    fam = get("mla_decode")
    dims = fam.dims_dict(shape)
    return DispatchTable([Entry("mla_decode", "bfloat16", {k: dims[k] for k in fam.exact_dims},
                                {k: [dims[k], dims[k]] for k in fam.range_dims}, variant,
                                dict(config), **fields)])


def _configs():
    from kernelsearch.families import get
    from tuner.search.mixed.space import label

    return {label(v, c) for v, c in get("mla_decode").space(SHAPE)}


@pytest.mark.parametrize("max_choices", [3, 1000])
def test_no_entry_slot_offers_no_choice_of_the_library_the_fallback_runs(flash_mla,
                                                                         max_choices):
    from tuner.search.mixed.space import TORCH, kernel_slots, suggested_point

    assert LIB in _configs()  # the stand-in makes FlashMLA a valid choice here
    shipped = _table("flashmla", {})  # a suggestion naming it changes nothing either
    (s,) = kernel_slots(CALLS, None, max_choices=max_choices, suggest=[shipped])
    assert s.choices[0] == TORCH and LIB not in s.choices, s.choices
    assert suggested_point([s], {s.name: TORCH}, [shipped]) == {}
    if max_choices == 1000:  # room for everything: every other config is still offered
        assert set(s.choices) == _configs() - {LIB} | {TORCH}
    assert len({s.runs(v) for v in s.choices}) == len(s.choices)
    assert s.runs(TORCH) == s.runs(LIB) == LIB  # what made it a no-op


def test_slot_with_a_triton_entry_offers_the_library_that_replaces_it(flash_mla):
    from tuner.search.mixed.space import TORCH, kernel_slots, label

    start = _table("splitkv", SPLITKV)
    (s,) = kernel_slots(CALLS, None, max_choices=3, start_table=start)
    here = label("splitkv", SPLITKV)
    assert s.covered_by(start) == here and s.choices[:2] == (LIB, here), s.choices
    # no entry would run the library too: one choice of the two, the one that says so
    assert TORCH not in s.choices and s.runs(here) != s.runs(LIB)


def test_slot_whose_entry_is_the_library_offers_no_torch_that_runs_it_too(flash_mla):
    from tuner.search.mixed.space import TORCH, Incumbent, JointSpace, kernel_slots

    start = _table("flashmla", {})
    (s,) = kernel_slots(CALLS, None, max_choices=3, start_table=start)
    assert s.choices[0] == LIB and TORCH not in s.choices and len(s.choices) == 3, s.choices
    joint = JointSpace({}, {}, [s], Incumbent({}, {}, {s.name: s.covered_by(start)}))
    assert joint.incumbent_point() == {s.name: LIB}  # the incumbent is a point of the space


def test_without_the_library_no_entry_is_torch_and_offered():
    from tuner.search.mixed.space import TORCH, kernel_slots, label

    start = _table("splitkv", SPLITKV)
    (s,) = kernel_slots(CALLS, None, max_choices=3, start_table=start)
    assert s.choices[:2] == (TORCH, label("splitkv", SPLITKV)) and LIB not in s.choices
    assert s.runs(TORCH) == TORCH


class _Decode:
    """A workload whose only kernel call FlashMLA takes; it measures the same every time (what
    is counted here is which candidates reach the A/B, not what they gain)."""

    name = "stand-in"
    device = "cpu"
    first_step_s = None

    def configure(self, runtime):
        pass

    def measure(self, repeats=5, timeout_s=None):
        from tuner.workloads.base import summarize

        return summarize("tokens/s", "tokens/s", {"decode@ctx130,b2": [100.0] * repeats})

    def runtime_dims(self):
        return {}

    def runtime_settings(self):
        return {}

    def validate_runtime(self, runtime):
        return {}

    def kernels_usable(self):
        return None

    def kernel_calls(self):
        return {c: 1 for c in CALLS}

    def kernel_variants(self):
        return None

    runs_stored_sources = False

    def install_table(self, table, store_dir=None):
        from tuner.workloads.base import install_here

        install_here(self, table, store_dir)

    def dispatch_changed(self):
        pass

    def check(self):
        return None

    def close(self):
        pass


def _search(tmp_path, start, proposer=None, budget=3):
    """Every choice of the slot drawn by the grid proposer (or `proposer(slot)`'s candidates):
    the slot, the trials and the evaluator (its incumbent as the search left it)."""
    from kernelsearch import dispatch
    from tests.search.helpers import Scripted
    from tuner.host import open_host
    from tuner.proposers import make
    from tuner.search import loop
    from tuner.search.mixed.run import build_evaluator
    from tuner.search.mixed.space import TORCH, kernel_slots, label
    from tuner.search.safety_context import SafetyContext
    from tuner.search.store import TrialStore

    wl = _Decode()
    slots = kernel_slots(wl.kernel_calls(), None, max_choices=3, start_table=start)
    (s,) = slots
    root = init_host(tmp_path / "h200", "h200", seed=2, os_tree=False)
    guard = SafetyContext(open_host("sim", root), tmp_path / "state", policy=POLICY)
    try:
        ev = build_evaluator({}, wl, guard, {}, slots, start, rounds=1, repeats=1)
        ev.verdicts.update(_judged(s, v, 1.0 if v == LIB else 1.5,
                                   kind="library" if v == LIB else "triton")
                           for v in set(s.choices) | {LIB} | {
                               label(e.variant, e.config) for e in (start.entries if start else [])}
                           if v != TORCH)
        ev.measure_incumbent()
        prop = make("grid", ev.joint.space, budget=budget) if proposer is None \
            else Scripted(ev.joint.space, proposer(s))
        with TrialStore.in_state_dir(tmp_path / "state") as store:
            trials = loop.run(prop, ev, store, store.new_run("search-mixed", {}), budget).trials
    finally:
        guard.close()
        dispatch.install(None)
    return s, trials, ev


def _ab(trials):
    """{label: trials} of the kernel choices measured end to end."""
    out: dict[str, int] = {}
    for t in trials:
        if "holistic" in t.measurements:
            for v in t.measurements["changed"]["kernels"].values():
                out[v] = out.get(v, 0) + 1
    return out


def test_no_op_library_choice_never_reaches_the_ab(tmp_path, flash_mla):
    s, trials, _ = _search(tmp_path, None)
    ab = _ab(trials)
    assert LIB not in ab, [(t.measurements.get("changed"), t.reason) for t in trials]
    # every choice that changes what runs was measured, each once
    assert ab == {v: 1 for v in s.choices[1:]} and len(ab) == 2


def test_library_choice_replacing_a_triton_entry_reaches_the_ab(tmp_path, flash_mla):
    s, trials, _ = _search(tmp_path, _table("splitkv", SPLITKV))
    assert _ab(trials).get(LIB) == 1, [(t.measurements.get("changed"), t.reason) for t in trials]


def test_no_op_library_choice_from_elsewhere_is_a_duplicate(tmp_path, flash_mla):
    """A candidate not drawn from the space (a seed, another proposer) naming the library the
    fallback already runs is turned away at the duplicate gate, never judged or measured."""
    from tuner.trial import Candidate

    s, trials, _ = _search(tmp_path, None, budget=1,
                        proposer=lambda s: [Candidate(kernels=[s.choice(LIB)])])
    (t,) = trials
    assert (t.verdict, t.reason) == ("rejected", "duplicate"), t.gates
    assert "holistic" not in t.measurements and "kernels" not in t.measurements
