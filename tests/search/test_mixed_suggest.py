"""`search mixed --suggest-table`: the tables shipped for this GPU are slot choices and the first
candidate (every slot they cover at once), judged and A/B-measured like any other candidate."""
from __future__ import annotations

import json

import pytest

from tests.search.test_mixed_search import POLICY, interp  # noqa: F401  (fixture)
from tests.simhelpers import run_cli
from tuner.sim.hostinit import init_host


def _table_for_the_sim_llama(tmp_path, pick=-1):
    """A table covering every rmsnorm call of the sim host's Llama with the family's `pick`-th
    valid config at that shape (the last one: never among the evenly spread picks)."""
    from kernelsearch.families import get
    from kernelsearch.table import DispatchTable
    from tuner.search.mixed.space import kernel_slots, label, trace_kernel_calls
    from tuner.sim.llama_host import SimHostLlamaWorkload

    root = init_host(tmp_path / "h200", "h200", seed=2, os_tree=False)
    wl = SimHostLlamaWorkload(root)
    slots = kernel_slots(trace_kernel_calls(wl.llama), ["rmsnorm"], max_choices=2)
    want = {s.name: label(*get("rmsnorm").space(s.shape)[pick]) for s in slots}
    table = DispatchTable([s.entry(want[s.name]) for s in slots])
    path = tmp_path / "shipped.json"
    table.save(path)
    return root, slots, want, path


def test_suggested_choices_are_offered_uncut_and_only_if_valid(tmp_path):
    from dataclasses import replace

    from kernelsearch.table import DispatchTable
    from tuner.search.mixed.space import TORCH, kernel_slots, suggested_point

    _, slots, want, path = _table_for_the_sim_llama(tmp_path)
    table = DispatchTable.load(path)
    calls = [(s.family, s.dtype, s.shape) for s in slots]
    got = kernel_slots(calls, ["rmsnorm"], max_choices=2, suggest=[table])
    # max_choices 2 leaves room for torch and one kernel: that one is the suggestion's
    assert {s.name: s.choices for s in got} == {n: (TORCH, v) for n, v in want.items()}
    assert suggested_point(got, {}, [table]) == want
    assert suggested_point(got, dict(want), [table]) == {}  # the incumbent already has it
    # a table entry whose config is not valid at the slot's shape is no choice (the gate would
    # refuse it): here a config with a key the family's space does not have
    bad = DispatchTable([replace(e, config={**e.config, "BOGUS": 1}) for e in table.entries])
    got = kernel_slots(calls, ["rmsnorm"], max_choices=2, suggest=[bad])
    assert all(v not in s.choices for s in got for v in want.values())
    assert suggested_point(got, {}, [bad]) == {}


@pytest.mark.usefixtures("cli_env", "interp")
def test_the_shipped_table_is_the_first_candidate_of_search_mixed(capsys, tmp_path):
    from tuner.search.store import TrialStore

    root, slots, want, path = _table_for_the_sim_llama(tmp_path)
    rc, out, err = run_cli(capsys, "--sim-root", str(root), "search", "mixed", "--knob", "none",
                           "--no-runtime", "--family", "rmsnorm", "--proposer", "coordinate",
                           "--budget", "2", "--max-choices", "2", "--suggest-table", str(path),
                           "--rounds", "1", "--repeats", "1", "--policy", POLICY, "--json")
    assert rc == 0, err
    res = json.loads(out)
    with TrialStore.in_state_dir(tmp_path / "state") as st:
        trials = st.list(run_id=res["run_id"])
    first = trials[0]
    assert "shipped" in first.candidate.rationale
    chosen = {f"kernel.{k.family}.{k.shape_bucket}": f"{k.variant}{json.dumps(k.config, sort_keys=True, separators=(',', ':'))}"
              for k in first.candidate.kernels}
    assert chosen == want  # every covered slot at once
    # judged at each slot's shape and measured end to end like any candidate
    assert set(first.measurements["kernels"]) == set(want)
    assert all(v["code"] == "accepted" for v in first.measurements["kernels"].values())
    assert first.verdict in ("kept", "reverted") and "holistic" in first.measurements
    # the proposer's own trials come after it and never repeat it
    assert trials[1].candidate.rationale != first.candidate.rationale
    assert trials[1].candidate.key() != first.candidate.key()


@pytest.mark.usefixtures("cli_env", "interp")
def test_suggest_auto_on_a_machine_without_a_gpu_suggests_nothing(capsys, tmp_path):
    from tuner.search.store import TrialStore

    root = init_host(tmp_path / "h200", "h200", seed=2, os_tree=False)
    rc, out, err = run_cli(capsys, "--sim-root", str(root), "search", "mixed", "--knob", "none",
                           "--no-runtime", "--family", "rmsnorm", "--proposer", "coordinate",
                           "--budget", "1", "--max-choices", "2", "--rounds", "1",
                           "--repeats", "1", "--policy", POLICY, "--json")
    assert rc == 0, err
    with TrialStore.in_state_dir(tmp_path / "state") as st:
        (t,) = st.list(run_id=json.loads(out)["run_id"])
    assert "shipped" not in t.candidate.rationale


def test_seeded_points_come_first_and_the_inner_proposer_learns_from_them():
    from tuner.proposers import Dim, SearchSpace, make
    from tuner.proposers.seeded import seeded
    from tuner.trial import Trial

    space = SearchSpace([Dim("a", [1, 2, 3]), Dim("b", ["x", "y"])], start={"a": 2, "b": "x"})
    inner = make("coordinate", space, budget=10, points_per_sweep=3)
    p = seeded(inner, [{"a": 3, "b": "y"}], rationale="shipped")
    c = p.ask()
    assert c.knobs == {"a": 3, "b": "y"} and c.rationale == "shipped"
    p.tell(Trial(candidate=c, verdict="kept", reason="better", objective=2.0))
    assert inner.best == {"a": 3, "b": "y"}  # the sweep moves to the kept seed
    asked = [p.ask().knobs for _ in range(4)]
    assert {"a": 3, "b": "y"} not in asked  # told points are never asked again
    assert seeded(inner, []) is inner


def test_the_coordinate_sweep_stays_on_the_incumbent_after_a_revert():
    """In a loop that judges against an incumbent, a reverted point is not the new centre: the
    next candidates must not carry its change (they would be confounded with it)."""
    from tuner.proposers import Dim, SearchSpace, make
    from tuner.trial import Trial

    space = SearchSpace([Dim("a", [1, 2, 3]), Dim("b", ["x", "y", "z"])], start={"a": 1, "b": "x"})
    p = make("coordinate", space, budget=10, points_per_sweep=3)
    first = p.ask()
    assert first.knobs != {"a": 1, "b": "x"}  # the incumbent itself is never proposed
    p.tell(Trial(candidate=first, verdict="reverted", reason="size_regressed", objective=5.0,
                 incumbent=4.0))
    for _ in range(3):
        c = p.ask()
        changed = {k for k, v in c.knobs.items() if v != {"a": 1, "b": "x"}[k]}
        assert len(changed) == 1, c.knobs  # one change over the incumbent, never two
        p.tell(Trial(candidate=c, verdict="reverted", reason="worse", objective=3.0, incumbent=4.0))


def test_a_slot_offers_only_the_variants_its_call_path_runs():
    """The HF patch's static-cache attention runs flashdec only: a splitkv choice in its slot
    would be measured as the torch path (on the H200 one such no-op was "kept" on noise)."""
    from kernelsearch.table import DispatchTable
    from tuner.search.mixed.space import TORCH, kernel_slots, parse_label
    from tuner.workloads.hf import HFWorkload

    call = ("decode_attention", "bfloat16", (8, 32, 8, 4104, 128))
    free = kernel_slots([call], None, max_choices=6)[0]
    assert {parse_label(v)[0] for v in free.choices[1:]} > {"flashdec"}  # splitkv too
    (slot,) = kernel_slots([call], None, max_choices=6, variants=HFWorkload.KERNEL_VARIANTS)
    assert slot.choices[0] == TORCH and len(slot.choices) == 6
    assert {parse_label(v)[0] for v in slot.choices[1:]} == {"flashdec"}
    # a suggestion table's entry in another variant is no choice either
    other = slot.entry(free.choices[[parse_label(v)[0] for v in free.choices].index("splitkv")])
    (slot2,) = kernel_slots([call], None, max_choices=2, variants=HFWorkload.KERNEL_VARIANTS,
                            suggest=[DispatchTable([other])])
    assert parse_label(slot2.choices[1])[0] == "flashdec"
