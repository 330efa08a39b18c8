"""The two MLA families past one bf16 query token: mla_decode_mtp (s_q = 2, what multi-token
prediction decodes, causal within the step) and mla_sparse_decode_fp8 (DeepSeek-V3.2's 656-byte
FP8 cache). Their references against the dense/bf16 ones, the FP8 layout's packing, and the
judge rejecting kernels that get the step's causality or the lengths wrong (interpreter)."""
import pytest
import torch

from kernelsearch.families import get, mla
from kernelsearch.harness.correctness import compare
from kernelsearch.harness.judge import judge

DENSE = get("mla_decode")
SPARSE = get("mla_sparse_decode")
MTP = get("mla_decode_mtp")
FP8 = get("mla_sparse_decode_fp8")
CFG = {"BLOCK_H": 16, "BLOCK_N": 16, "GRID": 132, "STAGES": 1, "num_warps": 4}


def _inputs(fam, shape, seed=0, dtype="float32"):
    return fam.make_inputs(shape, dtype, "cpu", torch.Generator().manual_seed(seed), "normal")


def test_mtp_reference_is_the_dense_one_per_token_over_its_causal_prefix():
    """Token 1 (the last of the step) sees the whole length, token 0 one position less; a
    sequence of length 1 leaves token 0 nothing: output 0."""
    q, kv, bt, sl, sc = _inputs(MTP, (3, 8, 70, 16, 2, 1), seed=1)
    assert q.shape == (3, 2, 8, mla.D_QK) and int(sl[2]) == 1
    ref, lse = MTP.reference(q, kv, bt, sl, sc, return_lse=True)
    assert ref.shape == (3, 2, 8, 512) and lse.shape == (3, 8, 2)  # FlashMLA's LSE layout
    last = DENSE.reference(q[:, 1].contiguous(), kv, bt, sl, sc)
    first = DENSE.reference(q[:, 0].contiguous(), kv, bt, (sl - 1).clamp_min(0), sc)
    torch.testing.assert_close(ref[:, 1], last)
    torch.testing.assert_close(ref[:, 0], first)
    assert (ref[2, 0] == 0).all() and (lse[2, :, 0] == float("inf")).all()


def test_mtp_torch_path_matches_and_takes_flashmla_inputs():
    """NaN in every unread row and 2147480000 in unused block-table slots, as FlashMLA's tests."""
    q, kv, bt, sl, sc = _inputs(MTP, (4, 8, 90, 16, 2, 1), seed=2)
    flat = kv.view(-1, mla.D_QK)
    flat[(flat == mla.POISON).all(dim=1)] = float("nan")
    for b in range(4):
        bt[b, -(-int(sl[b]) // 16):] = 2147480000
    out, lse = MTP.torch_default(q, kv, bt, sl, mla.FLASHMLA_DEFAULT_SCALE, return_lse=True)
    ref, ref_lse = MTP.reference(q, kv, bt, sl, mla.FLASHMLA_DEFAULT_SCALE, return_lse=True)
    assert not out.isnan().any()
    compare(out, ref, "float32", MTP, "mtp torch")
    torch.testing.assert_close(lse.double(), ref_lse, rtol=1e-5, atol=1e-5)


def test_judge_rejects_an_mtp_kernel_that_is_not_causal_within_the_step():
    src = MTP.variants["splitkv"].file.read_text()
    old = "ok = nmask[None, :] & (n[None, :] < lim[:, None])"
    assert old in src
    v = judge("mla_decode_mtp", src.replace(old, "ok = nmask[None, :] & (lim[:, None] > -1)"),
              CFG, device="cpu", timing=False, random_shapes=0, seeds=1)
    assert _wrong_values(v), v


from kernelsearch.families import mla_sparse_decode_fp8 as fp8  # noqa: E402


def test_fp8_layout_is_flashmlas_656_bytes():
    """512 e4m3 (x / its tile's scale), 4 float32 power-of-two scales, 64 bf16 rope values."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(5, mla.D_QK, generator=g) * torch.tensor([0.01, 1, 30, 500, 2])[:, None]
    x = x.to(torch.bfloat16)
    p = fp8.quantize(x)
    assert p.shape == (5, 656) and p.dtype == torch.uint8
    scales = p[:, 512:528].view(torch.float32)
    assert torch.equal(scales.log2(), scales.log2().round())  # powers of two
    for t in range(4):
        tile = x[:, t * 128:(t + 1) * 128].float()
        assert (tile.abs().amax(1) <= 448 * scales[:, t]).all()  # the tile fits e4m3's range
        want = (tile / scales[:, t:t + 1]).to(torch.float8_e4m3fn)
        assert torch.equal(p[:, t * 128:(t + 1) * 128], want.view(torch.uint8))
    assert torch.equal(p[:, 528:].view(torch.bfloat16), x[:, 512:])  # rope kept as it is
    d = fp8.dequantize(p)
    assert d.shape == (5, 576) and torch.equal(d[:, 512:], x[:, 512:].float())
    # e4m3 keeps 3 mantissa bits: at most 1/16 of the value off (plus the subnormal step)
    err = (d[:, :512] - x[:, :512].float()).abs()
    step = scales.repeat_interleave(128, dim=1) * 2.0 ** -9
    assert (err <= x[:, :512].float().abs() / 16 + step).all()
    # values already on the grid come back exactly: a round trip is a fixed point
    assert torch.equal(fp8.dequantize(fp8.quantize(d.to(torch.bfloat16))), d)


def test_fp8_reference_is_the_sparse_reference_over_the_dequantized_cache():
    q, c8, bt, sl, idx, sc = _inputs(FP8, (3, 16, 100, 16, 40, 1), seed=4)
    assert c8.shape[-1] == 656 and c8.dtype == torch.uint8
    deq = fp8.dequantize(c8)
    ref = FP8.reference(q, c8, bt, sl, idx, sc)
    torch.testing.assert_close(ref, SPARSE.reference(q, deq.double(), bt, sl, idx, sc))
    compare(FP8.torch_default(q, c8, bt, sl, idx, sc), ref, "float32", FP8, "fp8 torch")
    # every unread row holds the poison (e4m3 448 at scale 1, rope 300)
    rows = c8.view(-1, 656)
    read = torch.zeros(rows.shape[0], dtype=torch.bool)
    for b in range(3):
        pos = torch.arange(int(sl[b]))
        read[bt[b].long()[pos // 16] * 16 + pos % 16] = True
    assert (rows[~read][:, :512] == 0x7E).all()
    assert (rows[~read][:, 528:].view(torch.bfloat16) == mla.POISON).all()


def test_judge_rejects_an_fp8_kernel_that_attends_past_the_length():
    src = FP8.variants["rows"].file.read_text()
    old = "ok = (pos >= 0) & (pos < seqlen)"
    assert old in src
    v = judge("mla_sparse_decode_fp8", src.replace(old, "ok = pos >= 0"), CFG, device="cpu",
              timing=False, random_shapes=0, seeds=1)
    assert _wrong_values(v), v


def test_judge_rejects_an_fp8_kernel_that_ignores_the_tile_scales():
    src = FP8.variants["rows"].file.read_text()
    old = "kn = tl.reshape(f * sc[:, :, None], [BLOCK_N, 512])"
    assert old in src
    bad = src.replace(old, "kn = tl.reshape(f + 0 * sc[:, :, None], [BLOCK_N, 512])")
    v = judge("mla_sparse_decode_fp8", bad,
              CFG, device="cpu", timing=False, random_shapes=0, seeds=1)
    assert v.code == "incorrect", v


def _wrong_values(v) -> bool:
    """Rejected for wrong values: by a check, or by the repeated-call stage the judge runs at a
    random point (its detail names the rule that caught it there)."""
    return v.code == "incorrect" and (v.rule == "tolerance" or (
        v.rule == "repeated_calls" and v.detail.startswith("(tolerance)")))
