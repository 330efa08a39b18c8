"""The holistic workload on transformers (`--workload hf:<config>[:layers=N]`): sizes measured
through HF's own step with a StaticCache, the patch checked against the plain model before
timing, the kernel calls traced for a mixed search, and `search mixed` taking it end to end."""
from __future__ import annotations

import json
import os

import pytest

# before triton is imported: its standard-library functions are jitted at import, and the
# interpreter needs them built for it (as tests/kernelsearch/conftest.py does)
os.environ.setdefault("TRITON_INTERPRET", "1")

from kernelsearch import dispatch
from tests.hfhelpers import covering_table
from tests.simhelpers import REPO, run_cli
from tuner.workloads.hf import HFWorkload, Runtime, parse_spec

POLICY = str(REPO / "tuner/data/demo-policy.yaml")


@pytest.fixture
def interp(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    yield
    dispatch.install(None)


def test_spec_parsing():
    assert parse_spec("hf:llama3-8b:layers=4") == ("llama3-8b", {"num_hidden_layers": 4})
    assert parse_spec("tiny-qwen3") == ("tiny-qwen3", {})
    with pytest.raises(ValueError, match="unknown config"):
        parse_spec("hf:gpt-17")
    with pytest.raises(ValueError, match="layers=N"):
        parse_spec("hf:tiny-llama:layers=0")
    with pytest.raises(ValueError, match="layers=N"):
        parse_spec("hf:tiny-llama:heads=3")
    with pytest.raises(ValueError, match="runtime.compile"):
        Runtime.from_dict({"compile": "yes"})
    with pytest.raises(ValueError, match="unknown setting"):
        Runtime.from_dict({"cuda_graphs": True})


def test_measure_checks_the_patch_then_times_every_size(interp):
    wl = HFWorkload("hf:tiny-llama:layers=1", contexts=[16, 40], decode_steps=2)
    assert wl.model.config.num_hidden_layers == 1
    dispatch.install(covering_table(wl.model.config))
    s0 = dispatch.stats()
    m = wl.measure(repeats=2)
    assert dispatch.stats()["kernel"] > s0["kernel"]
    assert set(m.per_size) == {"prefill@ctx16,b1", "decode@ctx16,b2", "prefill@ctx40,b1",
                               "decode@ctx40,b2"}
    assert all(v > 0 for v in m.per_size.values()) and len(m.samples) == 2
    assert m.extra["check"]["ok"] and set(m.extra["check"]["errors"]) == {"prefill", "decode1"}
    assert m.extra["patched"] == {"rmsnorm": 3, "mlp": 1, "rope": 1, "attention": 1}
    wl.configure({"metaltune": False})
    m2 = wl.measure(repeats=1)
    assert m2.extra["patched"] == {} and m2.extra["check"] is None


def test_a_wrong_replacement_fails_the_check_before_timing(interp, monkeypatch):
    from kernelsearch.integrations import transformers_forwards
    from tuner.errors import WorkloadFailed

    def no_up(module, x):  # a plausible bug: the MLP without its up projection
        import torch

        return module.down_proj(torch.ops.metaltune.swiglu(module.gate_proj(x), module.gate_proj(x)))

    monkeypatch.setitem(transformers_forwards.FORWARDS, "mlp", no_up)
    wl = HFWorkload("hf:tiny-llama:layers=1", contexts=[16], decode_steps=1)
    dispatch.install(covering_table(wl.model.config))
    with pytest.raises(WorkloadFailed, match="patched outputs differ"):
        wl.measure(repeats=1)


def test_traced_kernel_calls_give_the_mixed_search_its_slots(interp):
    from tuner.search.mixed.space import kernel_slots, trace_kernel_calls

    wl = HFWorkload("hf:tiny-qwen3:layers=1", contexts=[16], decode_steps=1)
    calls = trace_kernel_calls(wl)
    fams = {f for f, _, _ in calls}
    assert {"rmsnorm", "swiglu", "rope", "decode_attention"} <= fams
    assert ("rope", "float32", (2, 6, 16)) in calls  # one decode token: 4 q + 2 kv heads
    assert ("rmsnorm", "float32", (2 * 4, 16)) in calls  # Qwen3's q_norm over the head dim
    slots = kernel_slots(calls, ["rmsnorm", "rope"], max_choices=3)
    assert {s.family for s in slots} == {"rmsnorm", "rope"}
    assert wl.model.patched_with is None and dispatch.installed() is None  # left as found


@pytest.mark.usefixtures("cli_env")
def test_search_mixed_takes_the_hf_workload(capsys, tmp_path, interp):
    from kernelsearch.table import DispatchTable
    from tuner.sim.hostinit import init_host

    root = init_host(tmp_path / "h200", "h200", seed=2, os_tree=False)
    rc, out, err = run_cli(capsys, "--sim-root", str(root), "search", "mixed", "--workload",
                           "hf:tiny-llama:layers=1", "--proposer", "random", "--budget", "2",
                           "--family", "rmsnorm", "--max-choices", "3", "--rounds", "1",
                           "--repeats", "1", "--policy", POLICY, "--seed", "1", "--json")
    assert rc == 0, err
    res = json.loads(out)
    assert res["trials"] == 2
    assert res["slots"] and all(s.startswith("kernel.rmsnorm.float32:") for s in res["slots"])
    table = DispatchTable.load(res["table"])
    assert len(table.entries) == len(res["kept"]["kernels"])


@pytest.mark.usefixtures("cli_env")
def test_a_bad_hf_spec_exits_2_with_one_line(capsys, tmp_path):
    from tuner.sim.hostinit import init_host

    root = init_host(tmp_path / "h200", "h200", seed=2, os_tree=False)
    rc, out, err = run_cli(capsys, "--sim-root", str(root), "search", "mixed", "--workload",
                           "hf:gpt-17", "--family", "none")
    assert rc == 2 and "unknown config" in err and err.count("\n") == 1, err


def test_diagnose_takes_the_hf_workload(interp):
    """`diagnose --model hf:<config>`: the transformers model's step profiled like the Llama's;
    with a covering table installed it is the patched model whose kernels run."""
    from tuner.workloads import diagnose as D
    from tuner.workloads.hf import HFModel

    ceil = {"flops_per_s": 5e10, "bytes_per_s": 2e10, "source": "test"}
    plain = D.diagnose("hf:tiny-llama:layers=1", "decode", batch=2, ctx=16, steps=2,
                       device="cpu", ceilings=ceil, use_dispatch=False)
    assert plain["workload"]["model"] == "hf:tiny-llama:layers=1"
    ops = {r["op"] for r in plain["ops"]}
    assert "aten::mm" in ops or "aten::addmm" in ops
    dispatch.install(covering_table(HFModel("hf:tiny-llama:layers=1").config))
    s0 = dispatch.stats()["kernel"]
    D.diagnose("hf:tiny-llama:layers=1", "decode", batch=2, ctx=16, steps=2, device="cpu",
               ceilings=ceil)
    assert dispatch.stats()["kernel"] > s0


def test_prefill_sizes_stop_at_max_prefill_ctx():
    wl = HFWorkload("hf:tiny-llama:layers=1", contexts=[16, 64], max_prefill_ctx=32)
    assert wl.bench.sizes() == [("prefill", 1, 16), ("decode", 2, 16), ("decode", 2, 64)]
