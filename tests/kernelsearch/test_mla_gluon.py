"""The Gluon MLA kernels (kernelsearch/families/mla_decode/gluon_wgmma.py and
mla_sparse_decode/gluon_wgmma.py). Gluon does not
run under TRITON_INTERPRET=1 (gluon.jit has no interpreter path: triton 3.9 on this CPU asks for
a GPU driver, 3.6 on the H200 the same), so CI covers it two ways: on any machine, Triton
compiles it for sm_90 from source (no GPU needed) and its PTX has the Hopper instructions it is
written for; on a Hopper GPU, its output against the float64 reference on FlashMLA-style inputs
(ragged, pages 64 and 16, NaN in every unread row). The H200 timings are in
benchmarks/results/mla-new-families-h200-2026-12-01-run*.json."""
import importlib.util

import pytest
import torch

from kernelsearch.families import get, mla

DENSE = get("mla_decode")
FILE = DENSE.variants["splitkv"].file.parent / "gluon_wgmma.py"


COMPILE = r"""
import importlib.util, json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental import gluon

spec = importlib.util.spec_from_file_location("ks_mla_gluon_wgmma", sys.argv[1])
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
ptr = ["Q", "KV", "BT", "SL", "O", "Op", "Lp"]
ty = ["*bf16", "*bf16", "*i32", "*i32", "*bf16", "*fp32", "*fp32"]
sig = dict(zip(ptr, ty))
sig.update({k: "i32" for k in ("H", "n_splits", "split_len")})
sig["qk_scale"] = "fp32"
sig.update({k: "i32" for k in ("sqb", "sqh", "sbt", "sob", "soh")})
sig.update({k: "constexpr" for k in ("PAGE", "BLOCK_H", "BLOCK_N", "STAGES", "ONE", "PIPE",
                                     "NOLOAD", "num_warps")})
# what the launcher specialises on a real call: 16-byte aligned pointers and strides
attrs = {(i,): [["tt.divisibility", 16]] for i in list(range(7)) + [11, 12, 14, 15]}
out = []
for pipe, stages, block_n in json.loads(sys.argv[2]):
    consts = {"PAGE": 64, "BLOCK_H": 64, "BLOCK_N": block_n, "STAGES": stages, "ONE": False,
              "PIPE": pipe, "NOLOAD": 0, "num_warps": 8}
    src = gluon._runtime.GluonASTSource(mod._mla_gluon_partial, signature=sig,
                                        constexprs=consts, attrs=attrs)
    ck = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 8})
    ptx = ck.asm["ptx"]
    out.append({"sm90a": ".target sm_90a" in ptx, "wgmma": ptx.count("wgmma.mma_async"),
                "cp_async": ptx.count("cp.async"), "shared": ck.metadata.shared})
# the sparse kernel (mla_sparse_decode/gluon_wgmma.py): the same loop over gathered rows
spec = importlib.util.spec_from_file_location("ks_mla_sparse_gluon", sys.argv[3])
smod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(smod)
ssig = {"Q": "*bf16", "KV": "*bf16", "RW": "*i32", "O": "*bf16", "Op": "*fp32", "Lp": "*fp32"}
ssig.update({k: "i32" for k in ("H", "topk", "n_splits", "split_len")})
ssig["qk_scale"] = "fp32"
ssig.update({k: "i32" for k in ("nrows", "sqb", "sqh", "srb", "sob", "soh")})
ssig.update({k: "constexpr" for k in ("BLOCK_H", "BLOCK_N", "STAGES", "ONE", "PIPE", "NOLOAD",
                                      "num_warps")})
sattrs = {(i,): [["tt.divisibility", 16]] for i in list(range(6)) + [12, 13, 14, 15, 16]}
consts = {"BLOCK_H": 64, "BLOCK_N": 64, "STAGES": 2, "ONE": False, "PIPE": 1, "NOLOAD": 0,
          "num_warps": 8}
ck = triton.compile(gluon._runtime.GluonASTSource(smod._sparse_gluon_partial, signature=ssig,
                                                  constexprs=consts, attrs=sattrs),
                    target=GPUTarget("cuda", 90, 32), options={"num_warps": 8})
ptx = ck.asm["ptx"]
out.append({"sm90a": ".target sm_90a" in ptx, "wgmma": ptx.count("wgmma.mma_async"),
            "cp_async": ptx.count("cp.async"), "shared": ck.metadata.shared})
print("RESULT " + json.dumps(out))
"""
SPARSE_FILE = get("mla_sparse_decode").variants["rows"].file.parent / "gluon_wgmma.py"


def test_gluon_kernel_compiles_for_hopper_with_wgmma_and_async_copies():
    """In a child without TRITON_INTERPRET (the suite's conftest sets it; this kernel is compiled,
    never interpreted)."""
    import json
    import os
    import subprocess
    import sys

    pytest.importorskip("triton.experimental.gluon")
    cfgs = [(1, 2, 64), (0, 2, 64), (1, 4, 32)]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", COMPILE, str(FILE), json.dumps(cfgs),
                        str(SPARSE_FILE)],
                       capture_output=True, text=True, env=env, timeout=600)
    line = [x for x in r.stdout.splitlines() if x.startswith("RESULT ")]
    assert r.returncode == 0 and line, r.stderr[-3000:]
    results = json.loads(line[0][7:])
    assert len(results) == len(cfgs) + 1
    for cfg, res in zip(cfgs + ["sparse"], results):
        assert res["sm90a"], cfg
        assert res["wgmma"] > 0 and res["cp_async"] > 0, (cfg, res)
        assert res["shared"] <= 227 * 1024, (cfg, res)  # the ring fits an SM's shared memory


@pytest.mark.skipif(not torch.cuda.is_available()
                    or torch.cuda.get_device_capability()[0] != 9, reason="needs a Hopper GPU")
@pytest.mark.parametrize("shape", [(7, 128, 5000, 64, 1), (3, 128, 2049, 16, 1)])
def test_gluon_kernel_matches_the_reference_on_flashmla_style_inputs(shape, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    from kernelsearch.harness.correctness import compare

    spec = importlib.util.spec_from_file_location("ks_mla_gluon_wgmma", FILE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    args = DENSE.make_inputs(shape, "bfloat16", "cuda", torch.Generator().manual_seed(3))
    flat = args[1].view(-1, mla.D_QK)
    flat[(flat == mla.POISON).all(dim=1)] = float("nan")
    ref = DENSE.reference(*args)
    for cfg in (dict(BLOCK_N=64, STAGES=2, GRID=132, PIPE=1),
                dict(BLOCK_N=32, STAGES=4, GRID=528, PIPE=1)):
        compare(mod.forward(*args, **cfg), ref, "bfloat16", DENSE, f"gluon {shape} {cfg}")


@pytest.mark.skipif(not torch.cuda.is_available()
                    or torch.cuda.get_device_capability()[0] != 9, reason="needs a Hopper GPU")
@pytest.mark.parametrize("shape", [(7, 128, 5000, 64, 2048, 1), (3, 128, 1500, 16, 2048, 1)])
def test_sparse_gluon_kernel_matches_the_reference(shape, monkeypatch):
    from kernelsearch.harness.correctness import compare

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    fam = get("mla_sparse_decode")
    spec = importlib.util.spec_from_file_location("ks_mla_sparse_gluon", SPARSE_FILE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    args = fam.make_inputs(shape, "bfloat16", "cuda", torch.Generator().manual_seed(3))
    flat = args[1].view(-1, mla.D_QK)
    flat[(flat == mla.POISON).all(dim=1)] = float("nan")
    ref = fam.reference(*args)
    for cfg in (dict(BLOCK_N=64, STAGES=2, GRID=132), dict(BLOCK_N=32, STAGES=4, GRID=264)):
        compare(mod.forward(*args, **cfg), ref, "bfloat16", fam, f"gluon sparse {shape} {cfg}")
