"""The mixed search against library kernels: where no entry covers a call dispatch runs the best
installed library kernel, so a slot's incumbent is that library kernel, and a searched choice the
judge timed no faster than it (`speedup_vs_library`, kernelsearch.table.behind_library) is
rejected before it is measured end to end: it could only tie or lose, and a loss at one size can
hide inside another size's gain in a candidate that changes several slots.

No library runs on the CPU, so the judge's records are written into the evaluator's verdict
cache (what the H200's judge returned for such choices: benchmarks/results/library-search-h200-*);
the holistic A/B and the keep rule are the real ones, on the simulated H200's Llama."""
from __future__ import annotations

import json

import pytest

from tests.search.test_mixed_search import POLICY, interp  # noqa: F401  (fixture)
from tuner.sim.hostinit import init_host


def _judged(slot, value, speedup_vs_library, kind="triton"):
    """The judge's record for `value` at `slot`, as MixedEvaluator.judge caches it."""
    c = slot.choice(value)
    key = json.dumps([c.family, slot.dtype, slot.shape, c.variant, c.config, None], sort_keys=True)
    rec = {"code": "accepted", "stage": "timing", "checks": ["stand-in record"],
           "speedup_vs_torch": 1.2, "speedup_min": 1.2, "device": "cuda:NVIDIA H200",
           "timed_shapes": [list(slot.shape)], "seconds": 0.0, "kind": kind,
           "library": "flashmla", "speedup_vs_library": speedup_vs_library}
    return key, rec


def test_behind_library_rule():
    from kernelsearch.table import LIBRARY_MARGIN, behind_library

    assert behind_library({"speedup_vs_library": 0.45, "library": "flashmla"}).startswith(
        "x0.45 against flashmla")
    assert behind_library({"speedup_vs_library": 1.0 + LIBRARY_MARGIN / 2}) is not None  # a tie
    assert behind_library({"speedup_vs_library": 1.57}) is None  # beats it: measured
    assert behind_library({"speedup_vs_library": None}) is None  # no library timed there
    assert behind_library({"speedup_vs_library": 1.0, "kind": "library"}) is None


@pytest.mark.usefixtures("interp")
def test_a_choice_slower_than_the_library_is_rejected_before_the_ab(tmp_path):
    from tests.search.helpers import Scripted
    from tuner.host import open_host
    from tuner.search import loop
    from tuner.search.mixed.run import build_evaluator
    from tuner.search.mixed.space import kernel_slots, trace_kernel_calls
    from tuner.search.safety_context import SafetyContext
    from tuner.search.store import TrialStore
    from tuner.sim.llama_host import SimHostLlamaWorkload
    from tuner.trial import Candidate

    root = init_host(tmp_path / "h200", "h200", seed=2, os_tree=False)
    wl = SimHostLlamaWorkload(root)
    slots = kernel_slots(trace_kernel_calls(wl.llama), ["rmsnorm"], max_choices=3)
    a, b = sorted((s for s in slots if len(s.choices) >= 2), key=lambda s: s.shape)[:2]
    guard = SafetyContext(open_host("sim", root), tmp_path / "state", policy=POLICY)
    try:
        ev = build_evaluator({}, wl, guard, {}, slots, rounds=1, repeats=1)
        ev.verdicts.update([_judged(a, a.choices[1], 0.45),  # the library 2.2x faster there
                            _judged(b, b.choices[1], 1.57)])  # beats the library
        ev.measure_incumbent()
        cands = [Candidate(kernels=[a.choice(a.choices[1])]),
                 # two slots at once: the winner does not carry the loser in with it
                 Candidate(kernels=[a.choice(a.choices[1]), b.choice(b.choices[1])]),
                 Candidate(kernels=[b.choice(b.choices[1])])]
        with TrialStore.in_state_dir(tmp_path / "state") as store:
            trials = loop.run(Scripted(ev.joint.space, cands), ev, store,
                              store.new_run("search-mixed", {}), 3).trials
    finally:
        guard.close()
    slow, both, fast = trials
    for t in (slow, both):
        assert (t.verdict, t.reason) == ("rejected", "slower_than_library"), t.gates
        assert t.gates[-1].gate == "library" and "x0.45 against flashmla" in t.gates[-1].detail
        assert "holistic" not in t.measurements  # nothing was measured end to end
    # the choice that beats the library goes on to the end-to-end A/B and its keep rule
    assert "holistic" in fast.measurements and fast.verdict in ("kept", "reverted"), fast.gates
    assert a.name not in {n for n, v in ev.joint.incumbent.kernels.items() if v != "torch"}


def test_deepseek_workload_takes_its_size_grid():
    """`--workload deepseek-v3.2:batch=8,32:ctx=...`: the sizes where a searched kernel and the
    library kernel differ (the sparse kernel wins at batch 8, loses at 32) in one search."""
    from tuner.errors import BadInput
    from tuner.workloads.factory import make_workload

    wl = make_workload(None, "deepseek-v3.2:batch=1,2:ctx=20", None, 60.0)
    assert (wl.name, wl.grid.decode_batches, wl.grid.contexts) == ("deepseek-v3.2", [1, 2], [20])
    assert make_workload(None, "deepseek", None, 60.0).grid.contexts == [20, 70]  # its own grid
    for bad in ("deepseek:batch=0", "deepseek:ctx=4k", "deepseek:layers=2", "deepseek:8"):
        with pytest.raises(BadInput, match="expected batch=N"):
            make_workload(None, bad, None, 60.0)


@pytest.mark.parametrize("with_library", [True, False])
def test_replay_measures_the_kept_table_against_library_only(tmp_path, with_library):
    """bench_kept_table.py: plain / kept table / library only (the empty table) where a library
    is found. A STAND-IN flash_mla package (tests/kernelsearch/test_libraries.py's) makes it
    found on the CPU; dispatch runs torch there in its place (library kernels take CUDA
    tensors), so this checks the replay's sides and ratios, not the library."""
    import os
    import subprocess
    import sys
    import textwrap

    from tests.kernelsearch.test_libraries import STANDIN_FLASH_MLA
    from tests.simhelpers import REPO

    pp = [str(REPO)]
    if with_library:
        (tmp_path / "lib" / "flash_mla").mkdir(parents=True)
        (tmp_path / "lib" / "flash_mla" / "__init__.py").write_text(
            textwrap.dedent(STANDIN_FLASH_MLA))
        pp.append(str(tmp_path / "lib"))
    table = tmp_path / "kept.json"
    table.write_text(json.dumps({"entries": []}))
    env = {k: v for k, v in os.environ.items() if k != "METALTUNE_FLASHMLA_EXT"}
    env.update(PYTHONPATH=os.pathsep.join(pp), TRITON_INTERPRET="1")
    r = subprocess.run([sys.executable, str(REPO / "benchmarks/bench_kept_table.py"),
                        "--workload", "deepseek-v3.2:batch=2:ctx=20", "--table", str(table),
                        "--pairs", "1", "--repeats", "1", "--out", str(tmp_path / "out")],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    rep = json.loads((tmp_path / "out" / "replay.json").read_text())
    size = "decode@ctx20,b2"
    if with_library:
        assert rep["libraries"] == ["flash_mla"]
        assert set(rep["medians"]) >= {"plain", "kept table", "library only"}
        assert rep["kept_vs_library_only"][size] == pytest.approx(
            rep["medians"]["kept table"][size] / rep["medians"]["library only"][size])
        assert rep["checks"]["library only"]["ok"] is True
        assert "| kept / library only |" in r.stdout
    else:
        assert rep["libraries"] == [] and "library only" not in rep["medians"]
        assert rep["kept_vs_library_only"] == {} and "kept / library only" not in r.stdout
    assert rep["checks"]["kept table"]["ok"] is True
