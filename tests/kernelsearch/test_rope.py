"""The rope family on the layout the model hands it: the q|k heads of a fused QKV row (a strided
view, v heads after them), rotated in one launch, equal to the float64 reference; its torch
fallback is the workload's plain rotary bit for bit; a dispatch entry routes to the kernel."""
import importlib

import pytest
import torch

from kernelsearch import dispatch
from kernelsearch.families import get
from kernelsearch.table import DispatchTable, Entry

FAM = get("rope")
CONFIGS = {"heads": {"BLOCK_H": 4, "num_warps": 1}, "flat": {"BLOCK": 128, "num_warps": 1}}


def qkv_view(B, NH, NV, D, dtype, g):
    """(B, NH, D) view of a (B, (NH + NV) * D) buffer whose v heads are NaN: a kernel that
    ignores the row stride reads NaN (or wrong heads) and fails the comparison."""
    buf = torch.randn(B, (NH + NV) * D, generator=g).to(dtype)
    buf[:, NH * D:] = float("nan")
    return buf[:, :NH * D].view(B, NH, D)


def angles(rows, D, g):
    pos = torch.randint(0, 131072, (rows,), generator=g).double()
    ang = pos[:, None] / (500000.0 ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    return ang.cos().float(), ang.sin().float()


@pytest.fixture(autouse=True)
def _no_table():
    yield
    dispatch.install(None)


@pytest.mark.parametrize("variant", sorted(CONFIGS))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_strided_qk_view_is_read_in_place_and_equals_the_reference(variant, dtype):
    fwd = importlib.import_module(f"kernelsearch.families.rope.{variant}").forward
    g = torch.Generator().manual_seed(7)
    B, NH, D = 3, 6, 18  # D/2 = 9: not a power of two (masked lanes)
    x = qkv_view(B, NH, 2, D, getattr(torch, dtype), g)
    assert not x.is_contiguous() and x.stride(0) == (NH + 2) * D
    atol, rtol, _ = FAM.tolerance(dtype)
    for rows in (1, B):  # one position broadcast (decode step) and one per sequence
        cos, sin = angles(rows, D, g)
        out = fwd(x, cos, sin, **CONFIGS[variant])
        assert out.is_contiguous() and out.shape == (B, NH, D) and out.dtype == x.dtype
        ref = FAM.reference(x, cos, sin)
        torch.testing.assert_close(out.double(), ref, atol=atol, rtol=rtol)
        # a contiguous copy of the same values gives the same bits
        assert torch.equal(fwd(x.contiguous(), cos, sin, **CONFIGS[variant]), out)
        # and the rotation is not the identity (a no-op kernel would fail here)
        assert (out.double() - x.double()).abs().max() > 0.1


def test_torch_default_is_the_workloads_plain_rotary_bit_for_bit():
    from tuner.workloads.llama import Llama, Ops

    g = torch.Generator().manual_seed(3)
    H, HKV, D = 4, 2, 16
    for dtype in (torch.float32, torch.bfloat16):
        x = qkv_view(2, H + HKV, HKV, D, dtype, g)
        cos, sin = angles(1, D, g)
        q = Llama.apply_rope(x[:, :H].reshape(2, H, 1, D), cos, sin)
        k = Llama.apply_rope(x[:, H:].reshape(2, HKV, 1, D), cos, sin)
        both = torch.cat([q, k], 1).squeeze(2)
        assert torch.equal(FAM.torch_default(x, cos, sin), both)
        assert torch.equal(Ops.plain_rope(x, cos, sin), both)


def test_dispatch_routes_rope_by_x_dtype_and_heads_and_falls_back_elsewhere():
    dispatch.install(DispatchTable([Entry("rope", "bfloat16", {"NH": 6, "D": 16}, {"B": [1, 4]},
                                          "heads", {"BLOCK_H": 8, "num_warps": 1})]))
    g = torch.Generator().manual_seed(4)
    x = qkv_view(3, 6, 2, 16, torch.bfloat16, g)
    cos, sin = angles(1, 16, g)  # float32 beside a bf16 x: the entry keys on x's dtype
    k0, f0 = dispatch.stats()["kernel"], dispatch.stats()["fallback"]
    out = dispatch.rope(x, cos, sin)
    assert dispatch.stats()["kernel"] == k0 + 1
    torch.testing.assert_close(out.double(), FAM.reference(x, cos, sin), atol=1.6e-2, rtol=1.6e-2)
    x5 = qkv_view(5, 6, 2, 16, torch.bfloat16, g)  # B outside [1, 4]
    assert torch.equal(dispatch.rope(x5, cos, sin), FAM.torch_default(x5, cos, sin))
    x4 = torch.randn(2, 6, 1, 16)  # not (B, NH, D): torch handles it
    assert torch.equal(dispatch.rope(x4, cos, sin), FAM.torch_default(x4, cos, sin))
    assert dispatch.stats()["kernel"] == k0 + 1 and dispatch.stats()["fallback"] == f0 + 2


def test_shape_of_buckets_on_batch_with_heads_and_head_dim_exact():
    g = torch.Generator().manual_seed(5)
    x, cos, sin = FAM.make_inputs((4, 40, 128), "bfloat16", "cpu", g, "normal")
    assert not x.is_contiguous() and cos.shape == (1, 64) and cos.dtype == torch.float32
    assert FAM.dims_dict(FAM.shape_of(x, cos, sin)) == {"B": 4, "NH": 40, "D": 128}
    assert FAM.make_inputs((4, 40, 128), "bfloat16", "cpu", g, "outliers")[1].shape == (4, 64)
    with pytest.raises(ValueError, match="cos/sin"):
        FAM.shape_of(x, cos[:, :10], sin)
