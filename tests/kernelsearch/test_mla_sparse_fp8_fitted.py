"""mla_sparse_decode_fp8's `fitted` variant (issue 45): one launch over the V3.2 FP8 cache aimed
at 16 and 32 heads. Under the CPU interpreter against the family's float64 reference: the
tensor-parallel head counts and an odd one (masked rows), ragged and full batches, programs
spanning requests and requests split over programs, a request selecting nothing, two calls
bit-identical; its declared space; and its sm_90 compile with Triton 3.6 (no GPU here)."""
import importlib.util

import pytest
import torch

from kernelsearch.families import get
from kernelsearch.harness.correctness import compare

FAM = get("mla_sparse_decode_fp8")


def _forward():
    spec = importlib.util.spec_from_file_location("ks_fp8_fitted", FAM.variants["fitted"].file)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.forward


def _inputs(shape, seed):
    return FAM.make_inputs(shape, "float16", "cpu", torch.Generator().manual_seed(seed), "normal")


def _cfg(bh, bn, grid):
    return dict(BLOCK_H=bh, BLOCK_N=bn, GRID=grid, STAGES=1, num_warps=4)


# (B, H, L, page, topk, R), BLOCK_H, BLOCK_N, GRID
@pytest.mark.parametrize("shape,bh,bn,grid", [
    # 16 heads, every request at the context: 4 tiles of 16 slots a request, 3 programs, so
    # program 1 ends request 0 and starts request 1 and each request is split (merged)
    ((2, 16, 70, 16, 64, 0), 16, 16, 3),
    # ragged lengths (skipped slots -1 and past the length); one program spans all three
    ((3, 16, 80, 16, 48, 1), 16, 32, 1),
    # 32 heads in one tile, 2 programs over 3 requests (one spans two, one is split)
    ((3, 32, 70, 16, 40, 1), 32, 16, 2),
    # 20 heads: a 32-row block with 12 rows masked, and two 16-row blocks (the second masked)
    ((2, 20, 60, 16, 40, 1), 32, 16, 3),
    ((2, 20, 60, 16, 40, 0), 16, 16, 5),
    # more programs than tiles: capped at one tile a program, every request split 3 ways
    ((2, 16, 40, 1, 48, 1), 16, 16, 132),
])
def test_fitted_matches_the_reference_and_is_deterministic(shape, bh, bn, grid):
    args = _inputs(shape, seed=7)
    if shape[-1]:
        assert len(set(args[3].tolist())) > 1, "a ragged batch draws a length per request"
    fwd = _forward()
    out = fwd(*args, **_cfg(bh, bn, grid))
    assert out.shape == (shape[0], shape[1], 512) and out.dtype == torch.float16
    compare(out, FAM.reference(*args), "float16", FAM, f"fp8 fitted {shape} GRID={grid}")
    # the merge order is fixed (slot order), whoever completes a request: bit-identical
    assert torch.equal(out, fwd(*args, **_cfg(bh, bn, grid)))


@pytest.mark.parametrize("grid", [1, 132])  # written directly; split and merged
def test_fitted_writes_zeros_for_a_request_that_selects_nothing(grid):
    q, kv, bt, sl, idx, sc = _inputs((3, 16, 60, 16, 32, 1), seed=2)
    idx[1] = -1  # nothing selected
    idx[2, ::2] = int(sl[2])  # at the length: skipped, the rest still attended
    ref = FAM.reference(q, kv, bt, sl, idx, sc)
    assert (ref[1] == 0).all()
    out = _forward()(q, kv, bt, sl, idx, sc, **_cfg(16, 16, grid))
    assert (out[1] == 0).all()
    compare(out, ref, "float16", FAM, f"fp8 fitted, empty request, GRID={grid}")


def test_fitted_space_sizes_the_head_block_to_the_heads():
    """16 heads: one 16-row MMA tile only; 32: 16 or 32; 20: 16 or 32 (masked rows); 64-row
    blocks on 8 warps only (the fp32 accumulator's registers); GRID up to 528 programs."""
    var = FAM.variants["fitted"]

    def blocks(h):
        return {c["BLOCK_H"] for c in var.configs((32, h, 32768, 64, 2048, 0))}
    assert blocks(16) == {16} and blocks(32) == {16, 32} and blocks(20) == {16, 32}
    cfgs = var.configs((32, 64, 32768, 64, 2048, 0))
    assert {c["num_warps"] for c in cfgs if c["BLOCK_H"] == 64} == {8}
    assert {c["GRID"] for c in cfgs} == {132, 264, 528}
    assert {c["BLOCK_N"] for c in cfgs} == {16, 32, 64} and {c["STAGES"] for c in cfgs} == {1, 2, 3}


COMPILE = r"""
import importlib.util, json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

spec = importlib.util.spec_from_file_location("ks_fp8_fitted", sys.argv[1])
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
sig = {"Q": "*bf16", "K8": "*u8", "KS": "*fp32", "KR": "*bf16", "BT": "*i32", "SL": "*i32",
       "IDX": "*i32", "O": "*bf16", "Op": "*fp32", "Lp": "*fp32", "CNT": "*i32"}
sig.update({k: "i32" for k in ("B", "H", "P", "topk", "CAP", "NROWS")})
sig["qk_scale"] = "fp32"
sig.update({k: "i32" for k in ("sqb", "sqh", "sbt", "sib", "sob", "soh")})
sig.update({k: "constexpr" for k in ("PAGE", "BLOCK_H", "BLOCK_N", "STAGES")})
attrs = {(i,): [["tt.divisibility", 16]] for i in range(11)}
out = []
for bh, bn, st, nw in json.loads(sys.argv[2]):
    consts = {"PAGE": 64, "BLOCK_H": bh, "BLOCK_N": bn, "STAGES": st}
    ck = triton.compile(ASTSource(mod._fitted, signature=sig, constexprs=consts, attrs=attrs),
                        target=GPUTarget("cuda", 90, 32),
                        options={"num_warps": nw, "num_stages": st})
    ptx = ck.asm["ptx"]
    out.append({"cfg": [bh, bn, st, nw], "sm90": ".target sm_90" in ptx,
                "mma": ptx.count("wgmma.mma_async") + ptx.count("mma.sync"),
                "atom": ptx.count("atom."), "acq_rel": ptx.count("acq_rel"),
                "shared": ck.metadata.shared})
print("TRITON " + triton.__version__)
print("RESULT " + json.dumps(out))
"""


def test_fitted_kernel_compiles_for_hopper_with_tensor_cores_and_an_acq_rel_counter():
    """No GPU here: Triton 3.6 (the H200's, .venv/triton-gluon) compiles the kernel for sm_90
    in a child without the interpreter: the MMA at 16 and 32 heads, the counter's acq_rel
    atomic that publishes each piece before the merge, shared memory within 227 KiB."""
    import json
    import subprocess
    import sys

    from tests.kernelsearch.test_mla_gluon import _gluon_triton

    env, why = _gluon_triton()
    if why:
        pytest.skip(why)
    cfgs = [(16, 64, 2, 4), (32, 32, 3, 4)]  # TP8's 16 heads; TP4's 32 heads
    r = subprocess.run([sys.executable, "-c", COMPILE, str(FAM.variants["fitted"].file),
                        json.dumps(cfgs)], capture_output=True, text=True, env=env, timeout=600)
    line = [x for x in r.stdout.splitlines() if x.startswith("RESULT ")]
    assert r.returncode == 0 and line, r.stderr[-3000:]
    for res in json.loads(line[0][7:]):
        assert res["sm90"] and res["mma"] > 0, res
        assert res["atom"] >= 1 and res["acq_rel"] >= 1, res
        assert res["shared"] <= 227 * 1024, res
