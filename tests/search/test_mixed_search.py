"""`metaltune search mixed`: host, runtime and kernel candidates in one run on a simulated H200
(its model scales the tiny Llama run for real on the CPU; kernels under Triton's interpreter),
each judged as one change against one incumbent (host state + dispatch table + runtime)."""
from __future__ import annotations

import json

import pytest

from tests.simhelpers import REPO, host_digest, run_cli
from tuner.sim.hostinit import init_host

POLICY = str(REPO / "tuner/data/demo-policy.yaml")
KNOBS = ("gpu0.power_limit_w", "gpu0.locked_clocks_mhz", "gpu0.locked_mem_clocks_mhz")
# the LLM proposer's recorded cheat: launches a no-op kernel for show, computes with torch
CHEAT = json.loads((REPO / "tests/proposers/llm/recordings/cheating_kernel.json").read_text())[
    "content"][0]["input"]["source"]


@pytest.fixture
def interp(monkeypatch):
    """Table kernels run on CPU tensors only under Triton's interpreter; one torch thread keeps
    the timings of a shared machine steady; the process-wide dispatch table is cleared after."""
    import torch

    from kernelsearch import dispatch

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
    dispatch.install(None)


def kept_state_is_the_hosts(root, knobs_or_host, settings) -> bool:
    """Re-applying the kept settings writes nothing: the host is already exactly in them."""
    if not isinstance(knobs_or_host, dict):
        from tuner.knobs import gpu

        knobs_or_host = {k.name: k for k in gpu.discover(knobs_or_host)}
    before = host_digest(root)
    for n, v in settings.items():
        knobs_or_host[n].apply(v)
    return host_digest(root) == before


def test_host_kernel_and_runtime_changes_are_one_trial_each_judged_end_to_end(tmp_path, interp):
    from kernelsearch import dispatch
    from tuner.host import open_host
    from tuner.knobs import gpu
    from tests.search.helpers import Scripted
    from tuner.search import loop
    from tuner.search.mixed.run import build_evaluator
    from tuner.search.mixed.space import RUNTIME_DIMS, kernel_slots, trace_kernel_calls
    from tuner.search.safety_context import SafetyContext
    from tuner.search.store import TrialStore
    from tuner.sim.inject import inject
    from tuner.sim.llama_host import SimHostLlamaWorkload
    from tuner.trial import Candidate, KernelChoice

    class XidWhileFused(SimHostLlamaWorkload):
        """The simulated GPU raises Xid 79 while the candidate with fused projections runs."""

        injected = False

        def measure(self, repeats=5, timeout_s=None):
            if self.llama.runtime.fuse_projections and not self.injected:
                self.injected = True
                inject(root, "xid", ["79"])
            return super().measure(repeats, timeout_s)

    root = init_host(tmp_path / "h200", "h200", seed=2, os_tree=False)
    host = open_host("sim", root)
    knobs = {k.name: k for k in gpu.discover(host) if k.name in KNOBS}
    # a host left at a low pinned clock: a gain no CPU timing noise of a shared machine can
    # hide follows (the Llama itself is really timed)
    knobs["gpu0.locked_clocks_mhz"].apply([600, 600])
    wl = XidWhileFused(root)
    slots = kernel_slots(trace_kernel_calls(wl.llama), ["rmsnorm"], max_choices=3)
    slot = next(s for s in slots if s.shape == (1, 64))  # the prefill's final norm: cheap here
    kernel = slot.choice(slot.choices[1])
    # 2.1x the low clock's modelled throughput, and stable and cool (the sim's optimum, at
    # 1770 MHz, runs at the slowdown threshold: the thermal monitor's call, not this test's)
    good = {"gpu0.power_limit_w": 600, "gpu0.locked_clocks_mhz": [1500, 1500],
            "gpu0.locked_mem_clocks_mhz": [3201, 3201]}
    guard = SafetyContext(host, tmp_path / "state", policy=POLICY)
    try:
        ev = build_evaluator(knobs, wl, guard, RUNTIME_DIMS, slots)
        inc = ev.joint.incumbent
        start_rt = dict(inc.runtime)
        ev.measure_incumbent()
        cands = [
            Candidate(knobs=good),
            Candidate(runtime={"cuda_graphs": False}),  # faster to the first token, slower after
            Candidate(kernel=KernelChoice(family="rmsnorm", variant="llm", source=CHEAT)),
            Candidate(kernels=[kernel]),  # honest, but the interpreter is slow end to end
            Candidate(knobs={"gpu0.power_limit_w": good["gpu0.power_limit_w"] + 50},
                      runtime={"fuse_projections": True}, kernels=[kernel]),  # hit by an Xid
        ]
        with TrialStore.in_state_dir(tmp_path / "state") as store:
            run_id = store.new_run("search-mixed", {})
            kernel_calls = {}  # after each trial: calls dispatch ran a table kernel for

            def note(t):
                kernel_calls[t.number] = dispatch.stats()["kernel"]

            trials = loop.run(Scripted(ev.joint.space, cands), ev, store, run_id, 5,
                              on_trial=note).trials
            stored = store.list(run_id=run_id)
        quarantined = guard.quarantined_keys()
    finally:
        guard.close()
    host_t, graphs_t, cheat_t, kernel_t, xid_t = trials

    # a real host gain passes the per-size rule and moves the incumbent
    assert (host_t.verdict, host_t.reason) == ("kept", "improved"), host_t.gates
    assert host_t.measurements["changed"]["kinds"] == ["host"]
    assert set(host_t.measurements["holistic"]["per_size"]) == {
        "prefill@ctx16,b1", "decode@ctx16,b2", "prefill@ctx64,b1", "decode@ctx64,b2"}
    assert inc.host == good
    # graphs off wins its micro-benchmark (first token, capture included) and loses end to end
    assert graphs_t.verdict == "reverted", graphs_t.gates[-1]
    assert graphs_t.reason in ("holistic_lost", "size_regressed"), graphs_t.gates[-1]
    assert graphs_t.measurements["holistic"]["micro_gain"] > 0.3
    assert graphs_t.measurements["holistic"]["per_size"]["decode@ctx16,b2"]["ratio"] < 0.7
    # the cheat is the harness's verdict, before anything was applied or measured
    assert (cheat_t.verdict, cheat_t.reason) == ("rejected", "guard_failed")
    assert [g.gate for g in cheat_t.gates][-1] == "guard" and "holistic" not in cheat_t.measurements
    # an accepted kernel really ran in the workload, lost there, and left the table
    assert kernel_t.gates[-2].gate == "apply" and kernel_t.verdict == "reverted", kernel_t.gates
    assert kernel_t.measurements["kernels"][slot.name]["code"] == "accepted"
    assert kernel_calls[4] > kernel_calls[3]  # dispatch ran the table's Triton kernel
    # the Xid during the candidate's run rolls back host, runtime and table alike
    assert (xid_t.verdict, xid_t.reason) == ("rolled_back", "instability_xid"), xid_t.gates
    assert xid_t.measurements["changed"]["kinds"] == ["host", "runtime", "kernel"]
    assert xid_t.candidate.key() in quarantined
    assert {n: k.read() for n, k in knobs.items()} == good == inc.host
    assert inc.runtime == start_rt and wl.runtime.fuse_projections is False
    assert wl.runtime.cuda_graphs is True
    assert inc.kernels == {s.name: "torch" for s in slots}
    assert dispatch.installed().entries == []  # the cheat and the loser never stayed in it
    assert kept_state_is_the_hosts(root, knobs, inc.host)
    # every trial is in the store, with what it changed
    assert [(t.verdict, t.reason) for t in stored] == [(t.verdict, t.reason) for t in trials]
    assert stored[4].measurements["changed"]["kinds"] == ["host", "runtime", "kernel"]
    assert stored[3].candidate.kernels[0].variant == kernel.variant


@pytest.mark.usefixtures("cli_env")
@pytest.mark.parametrize("proposer,budget", [("random", 2), ("coordinate", 6)])
def test_search_mixed_cli_with_a_proposer(capsys, tmp_path, interp, proposer, budget):
    from kernelsearch.table import DispatchTable
    from tuner.host import open_host
    from tuner.search.mixed.space import kinds_of
    from tuner.search.store import TrialStore

    root = init_host(tmp_path / "h200", "h200", seed=2, os_tree=False)
    rc, out, err = run_cli(capsys, "--sim-root", str(root), "search", "mixed", "--proposer",
                           proposer, "--budget", str(budget), "--family", "rmsnorm",
                           "--max-choices", "3", "--policy", POLICY, "--seed", "1", "--json")
    assert rc == 0, err
    res = json.loads(out)
    assert res["trials"] == budget and sum(res["by_verdict"].values()) == budget
    with TrialStore.in_state_dir(tmp_path / "state") as st:
        trials = st.list(run_id=res["run_id"])
    assert len(trials) == budget
    assert {"host", "runtime", "kernel"} <= {k for t in trials for k in kinds_of(t.candidate)}
    measured = [t for t in trials if "holistic" in t.measurements]
    assert measured and all(t.measurements["changed"]["kinds"] for t in measured)
    assert all(t.measurements["holistic"]["per_size"] for t in measured)
    for kind, counts in res["by_kind"].items():
        assert kind in ("host", "runtime", "kernel", "none") and all(":" in k for k in counts)
    # the table written is exactly the kept kernel choices; the host is in the kept state
    table = DispatchTable.load(res["table"])
    assert res["table"].startswith(str(tmp_path / "state" / "kernels"))
    assert len(table.entries) == res["table_entries"] == len(res["kept"]["kernels"])
    assert res["best_settings"].keys() == set(KNOBS)
    assert kept_state_is_the_hosts(root, open_host("sim", root), res["best_settings"])


@pytest.mark.usefixtures("cli_env")
@pytest.mark.parametrize("args, expect", [
    (["--budget", "0"], "--budget"),
    (["--proposer", "annealing"], "--proposer"),
    (["--family", "flash_mla"], "unknown kernel family 'flash_mla'"),
    (["--family", "matmul"], "no matmul call"),  # the tiny CPU Llama is float32: no matmul slot
    (["--family", "none", "--family", "rmsnorm"], "cannot be combined"),
    (["--knob", "gpu9.power_limit_w"], "unknown knob"),
    (["--workload", "sim", "--runtime"], "--runtime"),
    (["--workload", "sim", "--family", "rmsnorm"], "--family"),
    (["--policy", "/nonexistent/policy.yaml"], "policy.yaml"),
    (["--table", "/nonexistent/table.json"], "--table"),
    (["--suggest-table", "/nonexistent/table.json"], "--suggest-table"),
    (["--suggest-table", "auto", "--suggest-table", "/x.json"], "cannot be combined"),
])
def test_bad_input_exits_2_with_one_line_and_changes_nothing(capsys, tmp_path, interp, args, expect):
    root = init_host(tmp_path / "h200", "h200", seed=2, os_tree=False)
    before = host_digest(root)
    rc, out, err = run_cli(capsys, "--sim-root", str(root), "search", "mixed", *args)
    assert rc == 2, (out, err)
    assert expect in err and err.count("\n") == 1, err
    assert host_digest(root) == before
    assert not (tmp_path / "state" / "trials.db").exists()


@pytest.mark.usefixtures("cli_env")
def test_kernels_on_the_cpu_need_the_interpreter(capsys, tmp_path, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    root = init_host(tmp_path / "h200", "h200", seed=2, os_tree=False)
    rc, _, err = run_cli(capsys, "--sim-root", str(root), "search", "mixed", "--family", "rmsnorm")
    assert rc == 2 and "TRITON_INTERPRET=1" in err


def test_every_proposer_asks_in_the_joint_space(tmp_path):
    from tuner.host import open_host
    from tuner.knobs import gpu
    from tuner.proposers import SearchSpace, make
    from tuner.search.mixed.space import RUNTIME_DIMS, Incumbent, JointSpace, kernel_slots, kinds_of
    from tuner.trial import Candidate, Trial

    root = init_host(tmp_path / "h200", "h200", seed=2, os_tree=False)
    knobs = {k.name: k for k in gpu.discover(open_host("sim", root)) if k.name in KNOBS}
    # a float32 matmul gets no slot: the family's kernels take bf16/fp16 only
    slots = kernel_slots([("rmsnorm", "float32", (2, 64)), ("matmul", "float32", (2, 64, 64))],
                         None, max_choices=3)
    assert [s.name for s in slots] == ["kernel.rmsnorm.float32:2x64"] and len(slots[0].choices) == 3
    inc = Incumbent(host={n: k.read() for n, k in knobs.items()},
                    runtime={"cuda_graphs": True, "fuse_projections": False, "attn_impl": "sdpa"},
                    kernels={slots[0].name: "torch"})
    joint = JointSpace(knobs, RUNTIME_DIMS, slots, inc)
    # kinds interleaved, so a coordinate sweep meets each kind early
    assert joint.space.names[:3] == ["gpu0.power_limit_w", "runtime.cuda_graphs", slots[0].name]
    seen_kinds = set()
    for name in ("random", "grid", "coordinate", "optuna"):
        p = make(name, joint.space, seed=0, budget=8)
        for _ in range(4):
            c = p.ask()
            assert kinds_of(c), (name, c)  # only what differs from the incumbent
            assert all(not (k.variant is None and inc.kernels[slots[0].name] == "torch")
                       for k in c.kernels)
            seen_kinds.update(kinds_of(c))
            point = joint.from_candidate(c)
            assert point is not None and joint.to_candidate(point).key() == c.key()
            p.tell(Trial(candidate=c, verdict="reverted", reason="worse", objective=1.0))
    assert seen_kinds == {"host", "runtime", "kernel"}
    # the LLM proposes host knobs and runtime through its schema: its prompt lists exactly those
    llm = make("llm", SearchSpace(list(joint.host.dims), joint.to_candidate, joint.from_candidate),
               api_key="unused", kinds=("host",), runtime_options=RUNTIME_DIMS, gpu="NVIDIA H200")
    prompt = llm.system()
    assert "gpu0.power_limit_w" in prompt and "cuda_graphs" in prompt and "kernel." not in prompt
    # keys of candidates without kernel lists are what they were before the field existed
    assert '"kernels"' not in Candidate(knobs={"gpu0.power_limit_w": 500}).key()


def test_mixed_search_is_an_operation_the_daemon_runs_in_a_child():
    from tuner import ops
    from tuner.daemon.searches import SEARCH_OPS

    assert "search_mixed" in ops.names() and "search_mixed" in SEARCH_OPS


def test_kernel_slots_and_proposer_sources_go_through_the_judge_at_scale():
    """Both kernel paths of the mixed search use kernelsearch.harness.check as `kernel check`
    does: a proposer's source that computes only the first 64 rows is rejected at the
    boundary shape of 65 rows, and a shipped variant in a slot is timed at the slot's shape
    with the boundary shapes checked; the recorded verdict names its device and shapes."""
    from types import SimpleNamespace

    from tuner.search.mixed.evaluator import MixedEvaluator
    from tuner.trial import KernelChoice

    ev = SimpleNamespace(verdicts={}, isolate=False, device="cpu", judge_timeout_s=300.0,
                         _store=lambda: None)
    src = (REPO / "tests/kernelsearch/redteam/first_rows.py").read_text()
    r = MixedEvaluator.judge(ev, KernelChoice(family="softmax", variant="llm", source=src),
                             None, None)
    assert (r["code"], r["rule"]) == ("incorrect", "unwritten"), r
    assert "(65, 17)" in r["detail"] and r["device"] == "cpu-interpreter"
    slot = KernelChoice(family="softmax", variant="row", config={"ROWS": 1, "num_warps": 1})
    r = MixedEvaluator.judge(ev, slot, (4, 17), "float32")
    assert r["code"] == "accepted", r
    assert r["timed_shapes"] == [[4, 17]] and [257, 17] in r["checked_shapes"]


def test_a_stored_source_is_a_slot_choice_judged_and_run_from_the_store(tmp_path, interp):
    """Kernel slots offer the family's stored sources (`src:<sha256>`): judged again at the
    slot's shape from the store (a child process), installed with a copy of the store in the
    model process and run by dispatch there, never imported by the search's own process. A
    workload running in the search's process is refused the choice at the gate."""
    import sys

    from kernelsearch.harness.sandbox import module_name
    from kernelsearch.store import SourceStore, environment
    from tuner.host import open_host
    from tests.search.helpers import Scripted, record_model_stats
    from tuner.search import loop
    from tuner.search.mixed.run import build_evaluator, make_mixed_workload
    from tuner.search.mixed.space import kernel_slots, label, stored_sources
    from tuner.search.safety_context import SafetyContext
    from tuner.sim.llama_host import SimHostLlamaWorkload
    from tuner.search.store import TrialStore
    from tuner.trial import Candidate, KernelChoice

    good = json.loads((REPO / "tests/proposers/llm/recordings/good_kernel.json").read_text())[
        "content"][-1]["input"]
    store = SourceStore(tmp_path / "state" / "kernels" / "sources")
    sha = store.put("rmsnorm", good["source"], good["config"],
                    {"verdict": "accepted", "code": "accepted"}, env=environment("cpu")).sha256

    root = init_host(tmp_path / "h200", "h200", seed=2, os_tree=False)
    host = open_host("sim", root)
    wl = make_mixed_workload(host, "sim-llama", None, 600.0)
    slots = kernel_slots(wl.kernel_calls(), ["rmsnorm"], max_choices=3,
                         sources=stored_sources(store))
    slot = next(s for s in slots if s.shape == (1, 64))
    choice = label(f"src:{sha}", good["config"])
    assert slot.choices[:2] == ("torch", choice)  # before the family's own configs
    guard = SafetyContext(host, tmp_path / "state", policy=POLICY)
    try:
        here = build_evaluator({}, SimHostLlamaWorkload(root), guard, {}, slots,
                               store_dir=store.root)
        refused = here._kernels_known(Candidate(kernels=[slot.choice(choice)]))
        ev = build_evaluator({}, wl, guard, {}, slots, store_dir=store.root)
        ev.measure_incumbent()
        ran = record_model_stats(wl)  # the model process's stats with each measurement
        unknown = KernelChoice(family="rmsnorm", variant="src:" + "e" * 64, config={},
                               shape_bucket=slot.bucket)
        with TrialStore.in_state_dir(tmp_path / "state") as ts:
            trials = loop.run(Scripted(ev.joint.space, [Candidate(kernels=[slot.choice(choice)]),
                                                        Candidate(kernels=[unknown])]),
                              ev, ts, ts.new_run("search-mixed", {}), 2).trials
    finally:
        guard.close()
        wl.close()
    assert (refused.passed, refused.code) == (False, "not_installable"), refused
    t, bad = trials
    assert t.measurements["kernels"][slot.name]["code"] == "accepted", t.gates
    assert t.verdict in ("kept", "reverted") and "holistic" in t.measurements
    # dispatch ran the stored kernel inside the workload, in the (candidate's) model process only
    assert any(mp["dispatch"]["kernel"] > 0 and module_name(good["source"]) in mp["sources"]
               for mp in ran), ran
    assert module_name(good["source"]) not in sys.modules
    assert (bad.verdict, bad.reason) == ("rejected", "out_of_domain")
    assert "not a stored source" in bad.gates[-1].detail
