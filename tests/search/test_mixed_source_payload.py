"""A stored source carrying an annotation payload (`PROBE: exec("open(...)") = 0`) offered as a
mixed search's slot choice: judged in the sandbox, installed by `dispatch.install` in the model
process and run by the workload there (as `metaltune search mixed` runs it), the payload never
runs (its marker file never appears), whether the guard refuses the source or the loader keeps
its annotations unevaluated; the search's own process never imports it. Same evaluator path as
the CLI's `search mixed` (tests/search/test_mixed_model_process.py runs the CLI itself)."""
from __future__ import annotations

import json

from tests.search.test_mixed_search import POLICY, interp  # noqa: F401 (fixture)
from tests.simhelpers import REPO
from tuner.sim.hostinit import init_host



def payload_line(marker) -> str:
    """A module-level annotation that writes `marker` when evaluated, and keeps quiet where it
    cannot (the sandbox): so the judge, which imports it confined, still accepts the source."""
    code = f"try:\\n open({str(marker)!r}, 'w').write('ran')\\nexcept OSError:\\n pass"
    return f'PROBE: exec("{code}") = 0'

def test_an_annotation_payload_in_a_stored_source_never_runs_in_the_search(tmp_path, interp):  # noqa: F811
    import sys

    from kernelsearch.harness.sandbox import module_name
    from kernelsearch.store import SourceStore, environment
    from tests.search.helpers import Scripted, record_model_stats
    from tuner.host import open_host
    from tuner.search import loop
    from tuner.search.mixed.run import build_evaluator, make_mixed_workload
    from tuner.search.mixed.space import kernel_slots, label, stored_sources
    from tuner.search.safety_context import SafetyContext
    from tuner.search.store import TrialStore
    from tuner.trial import Candidate

    marker = tmp_path / "marker"
    good = json.loads((REPO / "tests/proposers/llm/recordings/good_kernel.json").read_text())[
        "content"][-1]["input"]
    src = good["source"].replace(
        "\n\n@triton.jit", "\n\n" + payload_line(marker) + "\n\n\n@triton.jit", 1)
    assert "PROBE: exec(" in src
    store = SourceStore(tmp_path / "state" / "kernels" / "sources")
    sha = store.put("rmsnorm", src, good["config"], {"verdict": "accepted", "code": "accepted"},
                    env=environment("cpu")).sha256
    root = init_host(tmp_path / "h200", "h200", seed=2, os_tree=False)
    wl = make_mixed_workload(open_host("sim", root), "sim-llama", None, 600.0)
    slots = kernel_slots(wl.kernel_calls(), ["rmsnorm"], max_choices=3,
                         sources=stored_sources(store))
    slot = next(s for s in slots if s.shape == (1, 64))
    choice = label(f"src:{sha}", good["config"])
    guard = SafetyContext(open_host("sim", root), tmp_path / "state", policy=POLICY)
    try:
        ev = build_evaluator({}, wl, guard, {}, slots, store_dir=store.root)
        ev.measure_incumbent()
        ran = record_model_stats(wl)  # the model process's stats with each measurement
        with TrialStore.in_state_dir(tmp_path / "state") as ts:
            (t,) = loop.run(Scripted(ev.joint.space, [Candidate(kernels=[slot.choice(choice)])]),
                            ev, ts, ts.new_run("search-mixed", {}), 1).trials
    finally:
        guard.close()
        wl.close()
    assert not marker.exists(), "the annotation payload ran"
    assert module_name(src) not in sys.modules, "the search's process imported the source"
    r = t.measurements["kernels"][slot.name]
    if r["code"] == "accepted":  # loaded and run there: its annotations were never evaluated
        assert t.verdict in ("kept", "reverted"), t.gates  # in the candidate's process:
        assert any(mp["dispatch"]["kernel"] > 0 for mp in ran), ran
    else:  # the guard refused it, by a named rule
        assert t.verdict == "rejected" and r["rule"], r
