"""A start-table entry measured no faster than the library (`speedup_vs_library` within
LIBRARY_MARGIN) gives way to it where it is found (kernelsearch.table.DispatchTable.choose): a
mixed search's incumbent at that slot is the library, which the host runs, not the entry's
Triton config; the no-op library choice is not drawn; and the tables the search builds keep the
field, so the kept table still gives way here and still runs the entry where the library is
absent. Choosing that Triton config (an entry without the field) makes it run: a real change.

Stand-in FlashMLA and judge records as in tests/search/test_mixed_library_noop.py."""
from __future__ import annotations

import pytest

from tests.kernelsearch.test_libraries import _fresh, flash_mla  # noqa: F401  (fixtures)
from tests.search.test_library_yardstick_mixed import _judged
from tests.search.test_mixed_library_noop import (CALLS, LIB, SHAPE, SPLITKV, _ab, _Decode,
                                                   _search, _table)
from tests.search.test_mixed_search import POLICY
from tuner.sim.hostinit import init_host

BEHIND, AHEAD = 0.6, 1.5  # the shipped h200-mla.json dense cells: FlashMLA 0.40-0.83
SHAPE2 = (2, 16, 258, 64, 1)  # a second decode FlashMLA takes


def _runs_at(table, shape):
    from kernelsearch.families import get

    return table.choose("mla_decode", "bfloat16", get("mla_decode").dims_dict(shape))


def _entry(table, shape):
    from kernelsearch.families import get

    return table.lookup("mla_decode", "bfloat16", get("mla_decode").dims_dict(shape))


def _lib_field(table, shape):
    e = _entry(table, shape)
    return None if e is None else (e.variant, e.speedup_vs_library)


@pytest.mark.parametrize("ratio", [BEHIND, AHEAD])
def test_the_slot_incumbent_is_what_the_start_table_runs(flash_mla, ratio):
    from tuner.search.mixed.space import TORCH, kernel_slots, label

    start = _table("splitkv", SPLITKV, speedup_vs_library=ratio)
    (s,) = kernel_slots(CALLS, None, max_choices=3, start_table=start)
    here = label("splitkv", SPLITKV)
    if ratio == BEHIND:  # gives way: the library runs, as with no entry
        assert s.covered_by(start) == TORCH and s.runs(s.covered_by(start)) == LIB
        assert s.choices[0] == TORCH and LIB not in s.choices, s.choices
    else:  # beats it: the entry runs, the library replaces it
        assert s.covered_by(start) == here and s.choices[:2] == (LIB, here), s.choices
    assert len({s.runs(v) for v in s.choices}) == len(s.choices)


def test_search_measures_against_the_library_and_draws_no_no_op(tmp_path, flash_mla):
    start = _table("splitkv", SPLITKV, speedup_vs_library=BEHIND)
    s, trials, ev = _search(tmp_path, start)
    assert s.runs(ev.joint.incumbent.kernels[s.name]) == LIB  # the search's incumbent
    assert _runs_at(ev.incumbent_table(), SHAPE)[2] == "flashmla"  # side A of every A/B
    ab = _ab(trials)
    assert LIB not in ab, [(t.measurements.get("changed"), t.reason) for t in trials]
    assert ab == {v: 1 for v in s.choices[1:]} and len(ab) == 2


def test_choosing_the_given_way_config_makes_it_run(tmp_path, flash_mla):
    from tuner.search.mixed.space import label
    from tuner.trial import Candidate

    here = label("splitkv", SPLITKV)
    start = _table("splitkv", SPLITKV, speedup_vs_library=BEHIND)
    s, (t,), ev = _search(tmp_path, start, budget=1,
                          proposer=lambda s: [Candidate(kernels=[s.choice(here)])])
    assert "holistic" in t.measurements and t.measurements["changed"]["kernels"] == {s.name: here}
    changed = ev.joint.incumbent.table({s.name: here}, ev.joint.slots)
    assert _runs_at(changed, SHAPE)[2] == "splitkv" and _lib_field(changed, SHAPE)[1] is None


class _TwoDecodes(_Decode):
    def kernel_calls(self):
        return {c: 1 for c in CALLS + [("mla_decode", "bfloat16", SHAPE2)]}


def test_the_kept_table_keeps_the_measured_field(tmp_path, flash_mla, monkeypatch):
    """The table the search writes (state/kernels/mixed-<run>.json) and every side B it builds
    carry each untouched entry's `speedup_vs_library`: dispatch reads it to give way."""
    from kernelsearch import dispatch
    from kernelsearch.table import DispatchTable
    from tuner.host import open_host
    from tuner.search.mixed.evaluator import MixedEvaluator
    from tuner.search.mixed.run import _run
    from tuner.search.mixed.space import kernel_slots, label
    from tuner.search.safety_context import SafetyContext

    start = DispatchTable(_table("splitkv", SPLITKV, speedup_vs_library=BEHIND).entries
                          + _table("splitkv", SPLITKV, SHAPE2, speedup=1.3,
                                   speedup_vs_library=AHEAD).entries)
    wl = _TwoDecodes()
    slots = kernel_slots(wl.kernel_calls(), None, max_choices=3, start_table=start)
    by_shape = {s.shape: s for s in slots}
    monkeypatch.setattr(MixedEvaluator, "judge", lambda self, k, shape, dtype: _judged(
        by_shape[tuple(shape)], label(k.variant, k.config), 1.0 if k.variant == "flashmla"
        else AHEAD, kind="library" if k.variant == "flashmla" else "triton")[1])
    root = init_host(tmp_path / "h200", "h200", seed=2, os_tree=False)
    host = open_host("sim", root)
    guard = SafetyContext(host, tmp_path / "state", policy=POLICY)
    try:
        res = _run(host, guard, wl, {}, {}, slots, start, [], budget=4, proposer="grid", seed=0,
                   repeats=1, rounds=1, timeout_s=60.0, isolate=False, on_trial=None, meta={})
    finally:
        guard.close()
        dispatch.install(None)
    assert res["trials"] == 4
    kept = DispatchTable.load(res["table"])
    assert _lib_field(kept, SHAPE) == ("splitkv", BEHIND) and _runs_at(kept, SHAPE)[2] == "flashmla"
    assert _lib_field(kept, SHAPE2) == ("splitkv", AHEAD) and _runs_at(kept, SHAPE2)[2] == "splitkv"
    assert _entry(kept, SHAPE2).speedup == 1.3 and len(kept.entries) == 2
    assert res["by_verdict"] == {"reverted": 4}, res  # each measured end to end, none kept


def test_a_side_b_changing_one_slot_leaves_the_others_as_measured(tmp_path, flash_mla):
    from kernelsearch.table import DispatchTable
    from tuner.host import open_host
    from tuner.search.mixed.run import build_evaluator
    from tuner.search.mixed.space import kernel_slots
    from tuner.search.safety_context import SafetyContext

    start = DispatchTable(_table("splitkv", SPLITKV, speedup_vs_library=BEHIND).entries
                          + _table("splitkv", SPLITKV, SHAPE2, speedup_vs_library=AHEAD).entries)
    wl = _TwoDecodes()
    a, b = sorted(kernel_slots(wl.kernel_calls(), None, max_choices=3, start_table=start),
                  key=lambda s: s.shape)
    assert (a.shape, b.shape) == (SHAPE, SHAPE2)
    root = init_host(tmp_path / "h200", "h200", seed=2, os_tree=False)
    guard = SafetyContext(open_host("sim", root), tmp_path / "state", policy=POLICY)
    try:
        inc = build_evaluator({}, wl, guard, {}, [a, b], start).joint.incumbent
    finally:
        guard.close()
    for name, other in ((b.name, LIB), (a.name, a.choices[1])):
        side_b = inc.table({**inc.kernels, name: other}, [a, b])
        untouched, ratio = (SHAPE, BEHIND) if name == b.name else (SHAPE2, AHEAD)
        assert _lib_field(side_b, untouched) == ("splitkv", ratio), side_b.entries
