"""`metaltune search mixed` runs its holistic workload in a model process (tuner.workloads.
model_process): the tables it measures, and the stored sources they name, are installed there,
confined as the judge's child is, and never in the search's own process (root in the daemon).
Its failures (a crash, a hang) are the trial's named reason and the search goes on."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

from tests.search.test_mixed_search import POLICY, interp  # noqa: F401 (fixture)
from tests.search.test_mixed_source_payload import payload_line
from tests.simhelpers import REPO
from tuner.sim.hostinit import init_host

GOOD = json.loads((REPO / "tests/proposers/llm/recordings/good_kernel.json").read_text())[
    "content"][-1]["input"]

# the real CLI (`python -m tuner`), with what its process imported and loaded written at exit
# (`-c`: no script folder on its path, which the sandbox user would have to read)
WRAPPER = """
import atexit, json, os, runpy, sys
out = sys.argv.pop(1)
import kernelsearch.harness.sandbox as sb
loads, real = [], sb.load
def load(source, tag=""):
    loads.append(sb.module_name(source))
    return real(source, tag)
sb.load = load
def dump():
    from kernelsearch import dispatch
    with open(out, "w") as f:
        json.dump({"pid": os.getpid(), "uid": os.geteuid(), "loads": loads,
                   "dispatch": dispatch.stats(),
                   "modules": sorted(m for m in sys.modules if m.startswith("ks_src_"))}, f)
atexit.register(dump)
sys.argv = ["metaltune"] + sys.argv[1:]
runpy.run_module("tuner", run_name="__main__", alter_sys=True)
"""


def _table(path, sha: str, config: dict) -> str:
    from kernelsearch.table import DispatchTable, Entry

    DispatchTable([Entry("rmsnorm", "float32", {"cols": 64}, {"rows": [1, 64]}, f"src:{sha}",
                         dict(config))]).save(path)
    return str(path)


def test_stored_sources_run_only_in_the_model_process_never_in_the_search(tmp_path):
    """Through the CLI: the start table names an accepted stored source (installed for the
    baseline), the suggested table one carrying an annotation payload. The first is loaded and
    run by the model process (another pid, the sandbox user) and never imported by the search;
    the second is refused by the judge by a named rule; its payload never runs anywhere."""
    from kernelsearch.harness.sandbox import module_name
    from kernelsearch.store import SourceStore, environment
    from tuner.search.store import TrialStore

    marker = tmp_path / "marker"
    bad = GOOD["source"].replace(
        "\n\n@triton.jit", "\n\n" + payload_line(marker) + "\n\n\n@triton.jit", 1)
    state = tmp_path / "state"
    store = SourceStore(state / "kernels" / "sources")
    verdict = {"verdict": "accepted", "code": "accepted"}
    good_sha = store.put("rmsnorm", GOOD["source"], GOOD["config"], verdict,
                         env=environment("cpu")).sha256
    bad_sha = store.put("rmsnorm", bad, GOOD["config"], verdict, env=environment("cpu")).sha256
    root = init_host(tmp_path / "h200", "h200", seed=2, os_tree=False)
    dump = tmp_path / "parent.json"
    env = {**os.environ, "PYTHONPATH": str(REPO), "METALTUNE_STATE_DIR": str(state),
           "METALTUNE_RUN_DIR": str(tmp_path / "run"), "TRITON_INTERPRET": "1",
           "OMP_NUM_THREADS": "1"}
    env.pop("METALTUNE_BACKEND", None)
    r = subprocess.run(
        [sys.executable, "-c", WRAPPER, str(dump), "--sim-root", str(root),
         "search", "mixed", "--knob", "none", "--family", "rmsnorm", "--no-runtime",
         "--budget", "1", "--max-choices", "2", "--policy", POLICY, "--json",
         "--table", _table(tmp_path / "start.json", good_sha, GOOD["config"]),
         "--suggest-table", _table(tmp_path / "suggest.json", bad_sha, GOOD["config"])],
        env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout)
    parent = json.loads(dump.read_text())
    with TrialStore.in_state_dir(state) as st:
        (trial,) = st.list(run_id=res["run_id"])
        (baseline,) = [r["meta"]["baseline"] for r in st.runs() if r["id"] == res["run_id"]]
    # the payload source: refused by the judge (in its sandbox) with a named rule
    assert trial.verdict == "rejected", trial.gates
    assert any(g.code and not g.passed and "annotation" in g.detail for g in trial.gates), \
        trial.gates
    assert not marker.exists(), "the annotation payload ran"
    # the accepted source ran in the model process: another pid, the sandbox user when root
    mp = baseline["extra"]["model_process"]
    assert module_name(GOOD["source"]) in mp["sources"], mp
    assert mp["dispatch"]["kernel"] > 0 and not mp["refused"], mp
    assert mp["pid"] != parent["pid"]
    if parent["uid"] == 0 and os.environ.get("KERNELSEARCH_SANDBOX_USER", "") != "none":
        assert mp["uid"] != 0 and mp["sandbox"]["uid"] == mp["uid"]
    assert "seccomp" in mp["sandbox"]["network"]
    # ...and never in the search's process: no stored source loaded, no ks_src_ module there,
    # no kernel call dispatched there
    assert parent["loads"] == [] and parent["modules"] == [], parent
    assert parent["dispatch"]["kernel"] == 0


def test_a_model_process_that_crashes_or_hangs_is_a_named_trial_and_the_search_goes_on(
        tmp_path, interp):  # noqa: F811
    """The model process killed during a candidate's measurement (model_crashed), then stopped
    so it never answers (model_timeout: its tree killed, the candidate quarantined as a hang):
    each is a rejected trial with its reason; a fresh process measures the next candidate."""
    from tests.search.helpers import Scripted
    from tuner.host import open_host
    from tuner.search import loop
    from tuner.search.mixed.run import build_evaluator, make_mixed_workload
    from tuner.search.safety_context import SafetyContext
    from tuner.search.store import TrialStore
    from tuner.trial import Candidate

    root = init_host(tmp_path / "h200", "h200", seed=2, os_tree=False)
    host = open_host("sim", root)
    wl = make_mixed_workload(host, "sim-llama", None, 60.0)
    wl.llama.grace_s = 2.0  # a stopped process is given up on 2 s after the measure's timeout
    real = wl.measure
    pids: dict[str, int] = {}

    def measure(repeats=5, timeout_s=None):
        """The first candidate side with fused projections: the process is stopped, then killed
        while the request waits (it cannot answer first); the first without graphs: stopped."""
        rt, pid = wl.llama.runtime_settings(), wl.llama.pid
        if pid is not None and rt["fuse_projections"] and "killed" not in pids:
            pids["killed"] = pid
            os.kill(pid, signal.SIGSTOP)
            threading.Timer(1.0, os.kill, (pid, signal.SIGKILL)).start()
        elif pid is not None and not rt["cuda_graphs"] and "stopped" not in pids:
            pids["stopped"] = pid
            os.kill(pid, signal.SIGSTOP)
        return real(repeats, timeout_s)

    wl.measure = measure
    guard = SafetyContext(host, tmp_path / "state", policy=POLICY)
    try:
        ev = build_evaluator({}, wl, guard, {"fuse_projections": [False, True],
                                              "cuda_graphs": [True, False]}, [],
                             rounds=1, repeats=1, timeout_s=20.0)
        ev.measure_incumbent()
        with TrialStore.in_state_dir(tmp_path / "state") as ts:
            trials = loop.run(Scripted(ev.joint.space, [
                Candidate(runtime={"fuse_projections": True}),
                Candidate(runtime={"cuda_graphs": False}),
                Candidate(runtime={"fuse_projections": True, "cuda_graphs": False})]),
                ev, ts, ts.new_run("search-mixed", {}), 3).trials
        quarantined = guard.quarantined_keys()
    finally:
        guard.close()
        wl.close()
    crashed, hung, fine = trials
    assert (crashed.verdict, crashed.reason) == ("rejected", "model_crashed"), crashed.gates
    assert "SIGKILL" in crashed.gates[-1].detail
    assert (hung.verdict, hung.reason) == ("rejected", "model_timeout"), hung.gates
    assert hung.candidate.key() in quarantined and crashed.candidate.key() not in quarantined
    assert fine.verdict in ("kept", "reverted") and "holistic" in fine.measurements, fine.gates
    assert len(pids) == 2 and wl.llama.pid is None  # each failed process is gone, and closed
    for pid in pids.values():
        assert not os.path.exists(f"/proc/{pid}") or _zombie(pid)


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] == "Z"
    except OSError:
        return True


def test_a_model_process_that_cannot_be_confined_is_refused_never_run_as_root(tmp_path):
    """As root, with no unprivileged account to become, no model process starts (so no stored
    source runs as root): `model_refused`, naming the account; nothing was started."""
    import pytest

    from tuner.workloads.model_process import ModelProcessFailed, ModelWorkload, Recipe

    if os.geteuid() != 0:
        pytest.skip("the sandbox user is needed only when root")
    with pytest.raises(ModelProcessFailed) as e:
        ModelWorkload(Recipe(workload="llama"), sandbox_user="no-such-user-h24")
    assert e.value.code == "model_refused" and "no-such-user-h24" in str(e.value)


def test_a_source_caught_computing_wrong_in_the_model_process_is_quarantined_in_the_store(
        tmp_path, interp, monkeypatch):  # noqa: F811
    """The kernel canary runs where the model runs: a stored source that computes wrong once
    installed (its output doubled there) is caught on its first call in the model process, and
    the search quarantines it in the real store (the model process holds a copy), so it is
    never offered again."""
    from tests.search.helpers import Scripted
    from tests.workloads.faults import in_model_process
    from kernelsearch.store import SourceStore, environment
    from tuner.host import open_host
    from tuner.search import loop
    from tuner.search.mixed.run import build_evaluator, make_mixed_workload
    from tuner.search.mixed.space import kernel_slots, label, stored_sources
    from tuner.search.safety_context import SafetyContext
    from tuner.search.store import TrialStore
    from tuner.trial import Candidate

    in_model_process(monkeypatch, tmp_path / "fault", wrong=True)
    store = SourceStore(tmp_path / "state" / "kernels" / "sources")
    sha = store.put("rmsnorm", GOOD["source"], GOOD["config"],
                    {"verdict": "accepted", "code": "accepted"}, env=environment("cpu")).sha256
    root = init_host(tmp_path / "h200", "h200", seed=2, os_tree=False)
    host = open_host("sim", root)
    wl = make_mixed_workload(host, "sim-llama", None, 600.0)
    slots = kernel_slots(wl.kernel_calls(), ["rmsnorm"], max_choices=3,
                         sources=stored_sources(store))
    slot = next(s for s in slots if s.shape == (1, 64))
    guard = SafetyContext(host, tmp_path / "state", policy=POLICY)
    try:
        ev = build_evaluator({}, wl, guard, {}, slots, rounds=1, repeats=1,
                             store_dir=store.root)
        ev.measure_incumbent()
        with TrialStore.in_state_dir(tmp_path / "state") as ts:
            (t,) = loop.run(Scripted(ev.joint.space, [Candidate(kernels=[
                slot.choice(label(f"src:{sha}", GOOD["config"]))])]),
                ev, ts, ts.new_run("search-mixed", {}), 1).trials
    finally:
        guard.close()
        wl.close()
    assert t.measurements["kernels"][slot.name]["code"] == "accepted", t.gates  # judged fine
    rec = store.record(sha)
    assert rec.quarantined and "kernel canary" in rec.quarantined["why"], rec.quarantined
    assert f"src:{sha}" not in {s for v in stored_sources(store).values() for s, _ in v}
