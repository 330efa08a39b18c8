"""Sparse MLA decode (DeepSeek-V3.2, DSA): forward(q, kv_cache, block_table, seq_lens, indices,
scale), the paged latent cache of mla_decode plus indices [B, topk] int32: the token positions a
lightning indexer selected (-1 = unused slot; positions at or past seq_lens[b] are skipped too).
FlashMLA takes physical cache rows instead (block * page + offset): `positions_to_rows` converts,
`rows_torch` / the `rows` variant's `forward_rows` take them directly.
Attends only the selected tokens; out [B, H, 512] in q's dtype (zeros where none is selected).
Compute-bound like dense MLA, on a gather: each selected row is 1152 contiguous bytes."""
from __future__ import annotations

from pathlib import Path

from kernelsearch.families import mla

H = 128
TOPK = 2048  # DeepSeek-V3.2's index_topk

# (B, H, L, page, topk, R): L the context (capacity), R 0 = every sequence at L with
# min(topk, L) tokens selected, 1 = ragged lengths and fewer valid indices than topk
SWEEP = ([(b, H, n, 64, TOPK, 0) for b in (1, 4, 16, 32, 64, 128) for n in (4096, 32768, 163840)]
         + [(8, H, 131072, 64, TOPK, 0)]
         # the tensor-parallel heads a GPU (16 / 32 / 64): full and ragged batches
         + [(b, h, n, 64, TOPK, 0) for h in mla.SMALL_HEADS for b in (8, 32, 128)
            for n in mla.CONTEXTS]
         + [(b, h, n, 64, TOPK, 1) for h in mla.SMALL_HEADS for b, n in ((32, 32768),
                                                                          (64, 131072))])
SEARCH = [(64, H, 4096, 64, TOPK, 0), (32, H, 32768, 64, TOPK, 0), (8, H, 131072, 64, TOPK, 0),
          (128, H, 8192, 64, TOPK, 0), (1, H, 163840, 64, TOPK, 0),
          (64, 16, 4096, 64, TOPK, 0), (32, 16, 32768, 64, TOPK, 1), (8, 32, 131072, 64, TOPK, 0),
          (32, 64, 32768, 64, TOPK, 0)]
HELDOUT = [(7, H, 5000, 64, TOPK, 1), (3, H, 1500, 16, TOPK, 1), (2, H, 40961, 1, TOPK, 1),
           (33, H, 8193, 64, TOPK, 1), (5, 16, 3000, 64, 512, 1), (9, 32, 7000, 64, TOPK, 1),
           (6, 64, 5000, 64, TOPK, 1)]
TINY = [(2, 16, 80, 16, 48, 1), (3, 4, 130, 64, 32, 1), (2, 8, 40, 1, 48, 1),
        (1, 16, 100, 16, 33, 0), (3, 32, 70, 16, 40, 1)]


def make_indices(B, L, page, topk, lens, ragged, gen):
    """Distinct positions < each length in random slots, -1 elsewhere; ragged: between one and
    min(topk, length) valid, and a position past the length in a spare slot (to be skipped)."""
    import torch

    cap = mla.capacity(L, page)
    pos = torch.arange(cap)
    score = torch.rand((B, cap), generator=gen)
    score[pos[None, :] >= lens[:, None]] = -1.0
    k = min(topk, cap)
    val, idx = score.topk(k, dim=1)
    idx = torch.where(val >= 0, idx, -1).to(torch.int32)
    if ragged:
        nvalid = (val >= 0).sum(1)
        keep = (torch.rand(B, generator=gen) * nvalid).long() + 1
        idx[torch.arange(k)[None, :] >= keep[:, None]] = -1
        for b in range(B):
            if int(keep[b]) < k and int(lens[b]) < cap:
                idx[b, int(keep[b])] = int(lens[b]) + int(torch.randint(
                    0, cap - int(lens[b]), (1,), generator=gen))
    if k < topk:
        idx = torch.cat([idx, torch.full((B, topk - k), -1, dtype=torch.int32)], dim=1)
    order = torch.rand((B, topk), generator=gen).argsort(dim=1)
    return idx.gather(1, order).contiguous()


def make_inputs(shape, dtype, device, gen, dist="normal"):
    B, nh, L, page, topk, ragged = shape
    q, kv, table, lens = mla.decode_inputs(B, nh, L, page, ragged, dtype, device, gen, dist)
    idx = make_indices(B, L, page, topk, lens, ragged, gen)
    return (q, kv, table, lens.to(device), idx.to(device), mla.SCALE)


def selected(indices, seq_lens, cap: int | None = None):
    ok = (indices >= 0) & (indices < seq_lens[:, None])
    return ok if cap is None else ok & (indices < cap)


def reference(q, kv_cache, block_table, seq_lens, indices, scale, *, return_lse: bool = False):
    ok = selected(indices, seq_lens)
    rows = [mla.gather_rows(kv_cache, block_table[b:b + 1], indices[b:b + 1][ok[b:b + 1]]
                            .view(1, -1))[0] for b in range(q.shape[0])]
    return mla.reference_rows(q, kv_cache, rows, scale, return_lse)


def positions_to_rows(kv_cache, block_table, seq_lens, indices):
    """Logical positions [B, topk] -> physical cache rows (block * page + offset, FlashMLA's
    `indices` form), -1 where the slot is skipped (-1, at or past the length)."""
    import torch

    ok = selected(indices, seq_lens, block_table.shape[1] * kv_cache.shape[1])
    rows = mla.safe_rows(kv_cache, block_table, indices, ok)
    return torch.where(ok, rows, -1).to(torch.int32)


def rows_torch(q, kv_cache, rows, scale, *, return_lse: bool = False):
    """Sparse decode over physical cache rows [B, topk] (what FlashMLA's sparse decode takes as
    `indices`: block * page + offset; -1 or any row outside the cache is unused), no block table
    needed. Output 0 and LSE +inf where a sequence selects nothing."""
    import torch

    nrows = kv_cache.shape[0] * kv_cache.shape[1]
    ok = (rows >= 0) & (rows < nrows)
    kv = kv_cache.view(-1, kv_cache.shape[-1])[torch.where(ok, rows.long(), 0)]
    return mla.plain_attention(q, kv, ok, scale, return_lse)


def reference_rows(q, kv_cache, rows, scale, *, return_lse: bool = False):
    """float64 reference over physical rows (rows_torch's form)."""
    nrows = kv_cache.shape[0] * kv_cache.shape[1]
    sel = [r[(r >= 0) & (r < nrows)].long() for r in rows]
    return mla.reference_rows(q, kv_cache, sel, scale, return_lse)


def torch_default(q, kv_cache, block_table, seq_lens, indices, scale, *,
                  return_lse: bool = False):
    """The gather path: the selected rows into a [B, topk, 576] tensor, then the dense torch
    path over them with the unused slots masked: safe for any value in a skipped slot or an
    unused block-table slot, NaN in unread rows, and rows selecting nothing (output 0)."""
    return rows_torch(q, kv_cache, positions_to_rows(kv_cache, block_table, seq_lens, indices),
                      scale, return_lse=return_lse)


def shape_of(q, kv_cache, block_table, seq_lens, indices, scale):
    B, nh, cap, page = mla.check_common(q, kv_cache, block_table, seq_lens)
    if indices.dim() != 2 or indices.shape[0] != B or str(indices.dtype) != "torch.int32" \
            or indices.stride(-1) != 1:
        raise ValueError("mla_sparse: indices must be [B, topk] int32 with unit last stride")
    return (B, nh, cap, page, indices.shape[1], 1)


def n_tokens(s) -> float:
    """Tokens attended, fewest possible: min(topk, L) per sequence at R=0, one at R=1."""
    B, L, topk, ragged = s[0], s[2], s[4], s[5]
    return float(B * min(topk, L)) if not ragged else float(B)


FAMILY = mla.family(
    "mla_sparse_decode", "forward(q, kv_cache, block_table, seq_lens, indices, scale)",
    Path(__file__).parent, {"splitkv": {}, "rows": {}},
    n_tokens=n_tokens, int32_reads=lambda s: s[0] * s[4] * 4 + s[0] * 4,  # indices, seq_lens
    shape_dims=("B", "H", "L", "P", "TOPK", "R"), exact_dims=("H", "P", "TOPK"),
    cheap=(1, 16, 100, 16, 33, 0), search=SEARCH, sweep=SWEEP, heldout=HELDOUT, tiny=TINY,
    make_inputs=make_inputs, reference=reference, torch_default=torch_default,
    shape_of=shape_of)

# library variants (kernelsearch.families.library): offered where the library imports
from kernelsearch.families import library as _library  # noqa: E402

FLASHMLA_SPARSE_HEADS = (64, 128)  # FlashMLA's SM90 sparse kernel: 64-head tiles
# its top-k is walked two 64-index blocks at a time: `params.topk % (2*B_TOPK) == 0` is an
# assertion in the kernel (a top-k of 64 crashed the judge's child on the H200, 2026-12-01)
FLASHMLA_SPARSE_TOPK = 128


def _flashmla_sparse_fit(s):
    k = FLASHMLA_SPARSE_TOPK
    topk = max(k, -(-s[4] // k) * k)
    return (s[0], s[1] if s[1] in FLASHMLA_SPARSE_HEADS else 128, s[2], s[3], topk, s[5])


FAMILY.variants["flashmla_sparse"] = _library.variant(
    "flashmla_sparse", Path(__file__).parent, "flash_mla",
    fits=lambda s: s[1] in FLASHMLA_SPARSE_HEADS and s[4] % FLASHMLA_SPARSE_TOPK == 0,
    dtypes=("bfloat16",), fit=_flashmla_sparse_fit)


def _flashmla_padded_fit(s):
    return (s[0], s[1] if s[1] < 64 else 16) + _flashmla_sparse_fit(s)[2:]


# fewer heads than its 64-head tile (TP8: 16, TP4: 32): zero heads padded in, as vLLM does
FAMILY.variants["flashmla_sparse_padded"] = _library.variant(
    "flashmla_sparse_padded", Path(__file__).parent, "flash_mla",
    fits=lambda s: s[1] < 64 and s[4] % FLASHMLA_SPARSE_TOPK == 0,
    dtypes=("bfloat16",), fit=_flashmla_padded_fit)

# Gluon variants (kernelsearch.families.gluon): compiled for sm_90 only, offered where that holds
from kernelsearch.families import gluon as _gluon  # noqa: E402
from kernelsearch.families.mla_decode import gluon_valid as _gluon_valid  # noqa: E402

FAMILY.variants["gluon_wgmma"] = _gluon.variant(
    "gluon_wgmma", Path(__file__).parent,
    {"BLOCK_N": [32, 64], "GRID": [132, 264, 528], "STAGES": [2, 3, 4]},
    _gluon_valid)
# the warp-specialized ping-pong kernel over gathered rows (mla_decode's gluon_pingpong with a
# cp.async loader): its tile is fixed (64 heads x 64 rows, two stages); 2 or 4 loader warps, P
# from registers or shared memory, positions mapped to rows by the loaders (FOLD) or beforehand
FAMILY.variants["gluon_pingpong"] = _gluon.variant(
    "gluon_pingpong", Path(__file__).parent,
    {"GRID": [132, 264, 528, 1056], "STAGES": [2], "LOADERS": [2, 4], "P_SMEM": [0, 1],
     "FOLD": [0, 1]},
    lambda cfg, shape: True)
