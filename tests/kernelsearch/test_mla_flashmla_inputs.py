"""The MLA families on the inputs FlashMLA's own tests use (tests/test_flash_mla_*.py upstream):
ragged batches with zero-length sequences, 1 to 69 pages a sequence, block-table slots past a
sequence holding 2147480000, NaN in every cache row nobody may read, the scale 1/sqrt(576), sparse
rows that select nothing, sparse indices as physical cache rows. The torch path is dispatch's
fallback and must take all of them; the softmax LSE returned beside the output must let a user
merge partial attentions the way vLLM and SGLang do."""
import importlib

import pytest
import torch

from kernelsearch.families import get, mla
from kernelsearch.harness.correctness import compare

DENSE = get("mla_decode")
SPARSE = get("mla_sparse_decode")
UNUSED = 2147480000  # what FlashMLA's tests put in block-table slots no token sits in


def flashmla_cache(lens, page, H, dtype=torch.float32, seed=0):
    """(q, kv_cache, block_table, seq_lens) as FlashMLA's tests build them: pages shuffled,
    unused slots UNUSED, every row past a length (and every spare page) NaN."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.tensor(lens, dtype=torch.int32)
    B = len(lens)
    mb = max(1, -(-int(lens.max()) // page))
    nblocks = B * mb + 2
    perm = torch.randperm(nblocks, generator=g).to(torch.int32)
    table = perm[:B * mb].view(B, mb).clone()
    kv = torch.full((nblocks, page, mla.D_QK), float("nan"), dtype=dtype)
    for b in range(B):
        n = int(lens[b])
        used = -(-n // page)
        table[b, used:] = UNUSED
        for t in range(n):
            kv[table[b, t // page], t % page] = torch.randn(mla.D_QK, generator=g).to(dtype)
    q = torch.randn((B, H, mla.D_QK), generator=g).to(dtype)
    return q, kv, table, lens


# zero-length sequences beside one-token, one-page, just-past-a-page and 69-page ones
CASES = [(64, [0, 1, 64, 65, 69 * 64 - 5]), (16, [17, 0, 69 * 16, 3]), (1, [69, 0, 2, 1])]


@pytest.mark.parametrize("page,lens", CASES, ids=[f"page{p}" for p, _ in CASES])
def test_dense_torch_path_takes_flashmla_inputs(page, lens):
    """Failed before: IndexError on the unused slots, NaN out of the NaN rows and the
    zero-length sequences."""
    q, kv, bt, sl = flashmla_cache(lens, page, H=16)
    out, lse = DENSE.torch_default(q, kv, bt, sl, mla.FLASHMLA_DEFAULT_SCALE, return_lse=True)
    ref, ref_lse = DENSE.reference(q, kv, bt, sl, mla.FLASHMLA_DEFAULT_SCALE, return_lse=True)
    assert not out.isnan().any()
    compare(out, ref, "float32", DENSE, f"dense page {page}")
    for b, n in enumerate(lens):
        if n == 0:  # nothing attended: output exactly 0 and LSE +inf, as FlashMLA
            assert (out[b] == 0).all() and (lse[b] == float("inf")).all()
    assert lse.shape == (len(lens), 16) and lse.dtype == torch.float32
    torch.testing.assert_close(lse.double(), ref_lse, rtol=1e-5, atol=1e-5)


def _sparse_indices(lens, topk, g):
    """Positions per row: valid ones, -1, one past the length; row 1 selects nothing at all."""
    idx = torch.full((len(lens), topk), -1, dtype=torch.int32)
    for b, n in enumerate(lens):
        if n and b != 1:
            k = min(topk - 1, n)
            idx[b, :k] = torch.randperm(n, generator=g)[:k].to(torch.int32)
            idx[b, k] = n  # at the length: skipped
        idx[b] = idx[b, torch.randperm(topk, generator=g)]
    return idx


@pytest.mark.parametrize("page,lens", CASES, ids=[f"page{p}" for p, _ in CASES])
def test_sparse_torch_path_takes_flashmla_inputs_and_physical_rows(page, lens):
    """Failed before: IndexError (unused slots), NaN for rows selecting nothing and from NaN
    rows. The physical-row form (FlashMLA's `indices`) gives the same as logical positions."""
    q, kv, bt, sl = flashmla_cache(lens, page, H=16, seed=1)
    idx = _sparse_indices(lens, 40, torch.Generator().manual_seed(2))
    sc = mla.FLASHMLA_DEFAULT_SCALE
    out, lse = SPARSE.torch_default(q, kv, bt, sl, idx, sc, return_lse=True)
    ref, ref_lse = SPARSE.reference(q, kv, bt, sl, idx, sc, return_lse=True)
    assert not out.isnan().any()
    compare(out, ref, "float32", SPARSE, f"sparse page {page}")
    assert (out[1] == 0).all() and (lse[1] == float("inf")).all()
    torch.testing.assert_close(lse.double(), ref_lse, rtol=1e-5, atol=1e-5)
    # FlashMLA's form: block * page + offset, -1 unused; the conversion agrees with the table
    sp = importlib.import_module("kernelsearch.families.mla_sparse_decode")
    rows = sp.positions_to_rows(kv, bt, sl, idx)
    ok = (idx >= 0) & (idx < sl[:, None])
    pos = torch.where(ok, idx, 0).long()
    want = bt.long().gather(1, pos // page) * page + pos % page
    assert torch.equal(rows.long(), torch.where(ok, want, -1))
    # rows outside the cache count as unused too, like -1
    rows_bad = torch.where(rows < 0, torch.full_like(rows, kv.shape[0] * page + 7), rows)
    out_rows = sp.rows_torch(q, kv, rows_bad, sc)
    torch.testing.assert_close(out_rows, out)
    compare(out_rows, sp.reference_rows(q, kv, rows, sc), "float32", SPARSE, "physical rows")


def test_lse_merges_two_partial_attentions_into_the_whole():
    """What vLLM's merge_attn_states does with FlashMLA's LSE: o = sum_i o_i e^{lse_i} / sum_i
    e^{lse_i}, with +inf (empty part) read as -inf. Two halves of each sequence's rows, one half
    empty for sequence 1, give the attention over all of them."""
    sp = importlib.import_module("kernelsearch.families.mla_sparse_decode")
    q, kv, bt, sl = flashmla_cache([70, 33, 5], 16, H=16, seed=3)
    g = torch.Generator().manual_seed(8)
    idx = torch.stack([torch.cat([torch.randperm(int(n), generator=g)[:min(32, int(n))],
                                  torch.full((32 - min(32, int(n)),), -1)]).to(torch.int32)
                       for n in sl])
    rows = sp.positions_to_rows(kv, bt, sl, idx)
    a, b = rows.clone(), rows.clone()
    a[:, 16:] = -1
    b[:, :16] = -1
    a[1] = -1  # sequence 1: its first part attends nothing
    b[1] = rows[1]
    sc = mla.SCALE
    oa, la = sp.rows_torch(q, kv, a, sc, return_lse=True)
    ob, lb = sp.rows_torch(q, kv, b, sc, return_lse=True)
    la, lb = (x.masked_fill(x == float("inf"), float("-inf")) for x in (la, lb))
    m = torch.maximum(la, lb)
    wa, wb = (la - m).exp()[..., None], (lb - m).exp()[..., None]
    merged = (oa.double() * wa + ob.double() * wb) / (wa + wb)
    compare(merged.float(), sp.reference_rows(q, kv, rows, sc), "float32", SPARSE, "merged")
    _, lall = sp.rows_torch(q, kv, rows, sc, return_lse=True)
    torch.testing.assert_close(torch.logaddexp(la, lb), lall, rtol=1e-5, atol=1e-5)


def test_scale_constants_are_deepseeks_and_flashmlas():
    """The families' inputs use DeepSeek-V3's model scale; FlashMLA's softmax_scale=None means
    1/sqrt(576). They differ by sqrt(3): a user porting from FlashMLA passes the scale."""
    assert mla.SCALE == pytest.approx(192 ** -0.5)
    assert mla.FLASHMLA_DEFAULT_SCALE == pytest.approx(576 ** -0.5)
    q, kv, bt, sl = flashmla_cache([20, 9], 16, H=4, seed=4)
    a = DENSE.torch_default(q, kv, bt, sl, mla.SCALE)
    b = DENSE.torch_default(q, kv, bt, sl, mla.FLASHMLA_DEFAULT_SCALE)
    assert (a - b).abs().max() > 1e-3  # the scale is not ignored


@pytest.mark.parametrize("variant", ["splitkv", "tma"])
def test_dense_triton_variants_take_flashmla_inputs(variant, monkeypatch):
    """Under the Triton interpreter; splitkv also returns FlashMLA's LSE (one chunk and a
    merged split)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    from kernelsearch.harness.sandbox import load

    mod = load(DENSE.variants[variant].file.read_text(), "mla")
    q, kv, bt, sl = flashmla_cache([0, 1, 17, 80], 16, H=16, dtype=torch.float16, seed=5)
    sc = mla.FLASHMLA_DEFAULT_SCALE
    ref, ref_lse = DENSE.reference(q, kv, bt, sl, sc, return_lse=True)
    for grid in (1, 132):  # one chunk writes the output itself; several go through the merge
        cfg = {"BLOCK_H": 16, "BLOCK_N": 16, "GRID": grid, "STAGES": 1, "num_warps": 4}
        if variant == "splitkv":
            out, lse = mod.forward(q, kv, bt, sl, sc, return_lse=True, **cfg)
            torch.testing.assert_close(lse.double(), ref_lse, rtol=2e-3, atol=2e-3)
        else:
            out = mod.forward(q, kv, bt, sl, sc, **cfg)
        compare(out, ref, "float16", DENSE, f"{variant} grid {grid}")
        assert (out[0] == 0).all()


def test_sparse_rows_variant_takes_physical_rows_and_returns_lse(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    from kernelsearch.harness.sandbox import load

    sp = importlib.import_module("kernelsearch.families.mla_sparse_decode")
    mod = load(SPARSE.variants["rows"].file.read_text(), "mla")
    lens = [40, 0, 17, 33]
    q, kv, bt, sl = flashmla_cache(lens, 16, H=16, dtype=torch.float16, seed=6)
    idx = _sparse_indices(lens, 24, torch.Generator().manual_seed(7))
    rows = sp.positions_to_rows(kv, bt, sl, idx)
    sc = mla.FLASHMLA_DEFAULT_SCALE
    ref, ref_lse = sp.reference_rows(q, kv, rows, sc, return_lse=True)
    for grid in (1, 132):
        cfg = {"BLOCK_H": 16, "BLOCK_N": 16, "GRID": grid, "STAGES": 1, "num_warps": 4}
        out, lse = mod.forward_rows(q, kv, rows, sc, return_lse=True, **cfg)
        compare(out, ref, "float16", SPARSE, f"rows grid {grid}")
        torch.testing.assert_close(lse.double(), ref_lse, rtol=2e-3, atol=2e-3)
        assert (out[1] == 0).all() and (lse[1] == float("inf")).all()
        # the position form through the block table gives the same
        torch.testing.assert_close(mod.forward(q, kv, bt, sl, idx, sc, **cfg), out)
