"""A failure of the candidate's own run inside a holistic workload (what a CUDA graph capture
invalidated, CUDA out of memory or a Triton launch error is on a GPU) rejects that trial and
never crashes the search; the incumbent is measured fine afterwards; a programming error still
propagates; a device left unusable stops the search with one line.

The failure is injected at the narrowest point: the dispatched call of one table kernel at one
shape asks torch's allocator for a workspace no machine has, so torch itself raises (the CPU's
"can't allocate memory" RuntimeError, the analogue of CUDA out of memory). Everything around it
is real: the dispatcher, the table, the runners, the mixed evaluator, the CLI."""
from __future__ import annotations

import json
import os

import pytest

# before triton is imported: the interpreter needs its standard-library functions built for it
os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

from kernelsearch import dispatch  # noqa: E402
from kernelsearch.table import DispatchTable, Entry  # noqa: E402
from tests.simhelpers import REPO, run_cli  # noqa: E402
from tuner.errors import WorkloadBroken, WorkloadFailed  # noqa: E402

POLICY = str(REPO / "tuner/data/demo-policy.yaml")
HUGE = 1 << 50  # bytes: past any machine's memory and overcommit (1 PiB)


@pytest.fixture
def interp(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    yield
    dispatch.install(None)


def fail_at(monkeypatch, family: str, when, error=None):
    """From now on, the dispatched `family` call that a table kernel would run fails where
    `when(args)` holds: torch's allocator refuses the kernel's workspace (or `error` is raised:
    a programming error). Returns the list of (family, shape) calls that failed."""
    real = dispatch.call
    failed = []

    def call(fam, *args):
        if fam == family and dispatch.resolve(fam, *args) is not None and when(args):
            failed.append((fam, tuple(args[0].shape)))
            if error is not None:
                raise error
            torch.empty(HUGE, dtype=torch.uint8)  # RuntimeError: can't allocate memory
        return real(fam, *args)

    monkeypatch.setattr(dispatch, "call", call)
    return failed


def rmsnorm_table(cols: int = 64) -> DispatchTable:
    return DispatchTable([Entry("rmsnorm", "float32", {"cols": cols}, {"rows": [1, 4096]},
                                "row", {"ROWS": 1, "num_warps": 1})])


def test_a_failing_size_fails_the_measurement_in_one_line_and_the_incumbent_measures_after(
        interp, monkeypatch):
    from tuner.workloads.llama import LlamaWorkload

    wl = LlamaWorkload(contexts=[16, 64], decode_steps=2)
    failed = fail_at(monkeypatch, "rmsnorm", lambda a: a[0].shape[0] == 64)  # prefill@ctx64 only
    dispatch.install(rmsnorm_table())  # the candidate's table
    wl.dispatch_changed()
    with pytest.raises(WorkloadFailed) as e:
        wl.measure(repeats=1)
    msg = str(e.value)
    assert msg.startswith("llama: prefill@ctx64,b1: RuntimeError: ") and "allocate" in msg, msg
    assert "\n" not in msg and len(msg) < 400
    assert failed and all(shape == (64, 64) for _, shape in failed)
    assert wl.bench._runners == {}  # the sizes already prepared are dropped with it
    # the incumbent (no table) measures every size afterwards, in the same workload
    dispatch.install(None)
    wl.dispatch_changed()
    m = wl.measure(repeats=1)
    assert set(m.per_size) == {"prefill@ctx16,b1", "decode@ctx16,b2", "prefill@ctx64,b1",
                               "decode@ctx64,b2"} and all(v > 0 for v in m.per_size.values())
    # a failure inside the output check (the candidate path at 2 x 64 prefill rows) says so
    fail_at(monkeypatch, "rmsnorm", lambda a: a[0].shape[0] == 128)
    dispatch.install(rmsnorm_table())
    wl.dispatch_changed()
    with pytest.raises(WorkloadFailed, match=r"^llama: the output check: RuntimeError: "):
        wl.check()
    # and the time to a first step of a run that fails is no time at all (never a crash)
    assert wl.first_step_s("prefill", batch=2, ctx=64) == float("inf")
    # a programming error is no run failure: it propagates as it is
    fail_at(monkeypatch, "rmsnorm", lambda a: True, error=TypeError("forward() got 3 args"))
    with pytest.raises(TypeError, match="got 3 args"):
        wl.measure(repeats=1)
    # and KeyboardInterrupt is never caught
    fail_at(monkeypatch, "rmsnorm", lambda a: True, error=KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        wl.measure(repeats=1)


def test_the_hf_workload_fails_the_same_way(interp, monkeypatch):
    from tests.hfhelpers import covering_table
    from tuner.workloads.hf import HFWorkload

    wl = HFWorkload("hf:tiny-llama:layers=1", contexts=[16, 40], decode_steps=1)
    fail_at(monkeypatch, "rmsnorm", lambda a: a[0].reshape(-1, a[0].shape[-1]).shape[0] == 40)
    dispatch.install(covering_table(wl.model.config))
    wl.dispatch_changed()
    with pytest.raises(WorkloadFailed) as e:
        wl.measure(repeats=1)
    assert str(e.value).startswith("hf:tiny-llama:layers=1: prefill@ctx40,b1: RuntimeError: ")
    assert wl.bench._runners == {}
    wl.configure({"metaltune": False})  # the plain model, as an incumbent without the table
    m = wl.measure(repeats=1)
    assert m.extra["patched"] == {} and len(m.per_size) == 4


@pytest.mark.usefixtures("cli_env")
def test_search_mixed_deepseek_rejects_a_trial_whose_run_fails_and_goes_on(capsys, tmp_path,
                                                                           interp, monkeypatch):
    """The H200 crash, on the CPU: `search mixed --workload deepseek --proposer random` where
    the candidate's MLA kernel fails in the decode runner at one context (20: 32 slots), in
    the model process where the search runs the model."""
    from tests.workloads.faults import in_model_process
    from tuner.search.store import TrialStore
    from tuner.sim.hostinit import init_host

    in_model_process(monkeypatch, tmp_path / "fault", "mla_decode", "mla_slot_32")
    root = init_host(tmp_path / "h200", "h200", seed=2, os_tree=False)
    rc, out, err = run_cli(capsys, "--sim-root", str(root), "search", "mixed", "--workload",
                           "deepseek", "--knob", "none", "--no-runtime", "--family", "mla_decode",
                           "--max-choices", "2", "--proposer", "random", "--budget", "4",
                           "--rounds", "1", "--repeats", "1", "--policy", POLICY, "--seed", "3",
                           "--json")
    assert rc == 0, err
    res = json.loads(out)
    assert res["trials"] == 4 and res["slots"] == ["kernel.mla_decode.float16:2x4x32x16x1",
                                                   "kernel.mla_decode.float16:2x4x80x16x1"]
    with TrialStore.in_state_dir(tmp_path / "state") as st:
        trials = st.list(run_id=res["run_id"])
    assert len(trials) == 4
    bad = [t for t in trials if t.reason == "measure_failed"]
    assert bad and all(t.verdict == "rejected" for t in bad)
    detail = bad[0].gates[-1].detail
    assert bad[0].gates[-1].gate == "measure"
    assert detail.startswith("deepseek: decode@ctx20,b2: RuntimeError: "), detail
    # the search went on past the failure (no model process was lost over it)
    assert trials.index(bad[0]) < len(trials) - 1
    assert any("holistic" in t.measurements for t in trials)
    assert not [t for t in trials if t.reason.startswith("model_")]
    # the slot whose kernel failed is never kept
    assert res["kept"]["kernels"].get("kernel.mla_decode.float16:2x4x32x16x1") is None


@pytest.mark.usefixtures("cli_env")
def test_a_device_left_unusable_stops_the_search_with_one_line(capsys, tmp_path, interp,
                                                                monkeypatch):
    """After a sticky CUDA error every later call fails, the device probe too: the search
    stops (exit 1, one line) instead of rejecting every later trial. The probe's failure is the
    one thing stood in for here (a CPU has no sticky state), in the model process."""
    from tests.workloads.faults import in_model_process
    from tuner.search.store import TrialStore
    from tuner.sim.hostinit import init_host

    in_model_process(monkeypatch, tmp_path / "fault", "rmsnorm", "always", broken_probe=True)
    root = init_host(tmp_path / "h200", "h200", seed=2, os_tree=False)
    rc, out, err = run_cli(capsys, "--sim-root", str(root), "search", "mixed", "--workload",
                           "llama", "--knob", "none", "--no-runtime", "--family", "rmsnorm",
                           "--max-choices", "2", "--proposer", "random", "--budget", "3",
                           "--rounds", "1", "--repeats", "1", "--policy", POLICY, "--json")
    assert rc == 1, (out, err)
    assert err.count("\n") == 1 and "illegal memory access" in err and "restart" in err, err
    assert err.startswith("metaltune: error: llama: "), err
    with TrialStore.in_state_dir(tmp_path / "state") as st:
        stored = st.list()
    assert [t for t in stored if t.reason == "measure_failed"] == []  # none blamed
    # the trial whose run broke the device is stored, saying so; nothing ran after it
    assert [t.reason for t in stored][-1:] == ["workload_broken"]
    assert "illegal memory access" in stored[-1].gates[-1].detail


def test_a_broken_workload_refuses_every_later_call(interp, monkeypatch):
    from tuner.workloads import holistic
    from tuner.workloads.deepseek import DeepSeekWorkload

    wl = DeepSeekWorkload("tiny", contexts=[20])
    monkeypatch.setattr(holistic, "probe", lambda d: (_ for _ in ()).throw(
        RuntimeError("CUDA error: unspecified launch failure")))
    fail_at(monkeypatch, "mla_decode", lambda a: True)
    dispatch.install({"entries": [{"family": "mla_decode", "dtype": "float16",
                                   "match": {"H": 4, "P": 16},
                                   "ranges": {"B": [1, 8], "L": [1, 4096]}, "variant": "tma",
                                   "config": {"BLOCK_H": 16, "BLOCK_N": 16, "GRID": 132,
                                              "STAGES": 1, "num_warps": 4}}]})
    wl.dispatch_changed()
    with pytest.raises(WorkloadBroken, match="unspecified launch failure"):
        wl.measure(repeats=1)
    assert not issubclass(WorkloadBroken, WorkloadFailed)  # the evaluator must not catch it
    dispatch.install(None)
    wl.dispatch_changed()
    with pytest.raises(WorkloadBroken, match="restart the process"):
        wl.measure(repeats=1)  # nothing on that device is to be trusted any more
