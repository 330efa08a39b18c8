"""The Gluon mla_decode kernel (kernelsearch/families/mla_decode/gluon_wgmma.py). Gluon does not
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


_LOADED: list = []


def _module(monkeypatch):
    """Loaded once, with the interpreter off: the suite runs Triton's interpreter (conftest),
    and this kernel is compiled, never interpreted."""
    if not _LOADED:
        monkeypatch.setenv("TRITON_INTERPRET", "0")
        spec = importlib.util.spec_from_file_location("ks_mla_gluon_wgmma", FILE)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        _LOADED.append(mod)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    return _LOADED[0]


@pytest.mark.parametrize("pipe,stages,block_n", [(1, 2, 64), (0, 2, 64), (1, 4, 32)])
def test_gluon_kernel_compiles_for_hopper_with_wgmma_and_async_copies(pipe, stages, block_n,
                                                                     monkeypatch):
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.experimental import gluon

    mod = _module(monkeypatch)
    ptr = {"Q": "*bf16", "KV": "*bf16", "BT": "*i32", "SL": "*i32", "O": "*bf16",
           "Op": "*fp32", "Lp": "*fp32"}
    ints = ["H", "n_splits", "split_len"]
    sig = {**ptr, **{k: "i32" for k in ints}, "qk_scale": "fp32",
           **{k: "i32" for k in ("sqb", "sqh", "sbt", "sob", "soh")},
           **{k: "constexpr" for k in ("PAGE", "BLOCK_H", "BLOCK_N", "STAGES", "ONE", "PIPE",
                                       "NOLOAD", "num_warps")}}
    consts = {"PAGE": 64, "BLOCK_H": 64, "BLOCK_N": block_n, "STAGES": stages, "ONE": False,
              "PIPE": pipe, "NOLOAD": 0, "num_warps": 8}
    # what the launcher specialises on a real call: 16-byte aligned pointers and strides
    attrs = {(i,): [["tt.divisibility", 16]] for i in list(range(7)) + [11, 12, 14, 15]}
    src = gluon._runtime.GluonASTSource(mod._mla_gluon_partial, signature=sig,
                                        constexprs=consts, attrs=attrs)
    ck = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 8})
    ptx = ck.asm["ptx"]
    assert ".target sm_90a" in ptx
    assert "wgmma.mma_async" in ptx and "cp.async" in ptx
    assert ck.metadata.shared <= 227 * 1024  # one program's ring fits the SM's shared memory


@pytest.mark.skipif(not torch.cuda.is_available()
                    or torch.cuda.get_device_capability()[0] != 9, reason="needs a Hopper GPU")
@pytest.mark.parametrize("shape", [(7, 128, 5000, 64, 1), (3, 128, 2049, 16, 1)])
def test_gluon_kernel_matches_the_reference_on_flashmla_style_inputs(shape, monkeypatch):
    from kernelsearch.harness.correctness import compare

    mod = _module(monkeypatch)
    args = DENSE.make_inputs(shape, "bfloat16", "cuda", torch.Generator().manual_seed(3))
    flat = args[1].view(-1, mla.D_QK)
    flat[(flat == mla.POISON).all(dim=1)] = float("nan")
    ref = DENSE.reference(*args)
    for cfg in (dict(BLOCK_N=64, STAGES=2, GRID=132, PIPE=1),
                dict(BLOCK_N=32, STAGES=4, GRID=528, PIPE=1)):
        compare(mod.forward(*args, **cfg), ref, "bfloat16", DENSE, f"gluon {shape} {cfg}")
