"""Sparse MLA decode over DeepSeek-V3.2's FP8 latent cache (what FlashMLA's FP8 sparse decode
reads): forward(q, kv_cache, block_table, seq_lens, indices, scale) as mla_sparse_decode, but
kv_cache is uint8 [num_blocks, page, 656]: per token 512 float8 e4m3 values (the compressed
latent, in 4 tiles of 128), 4 float32 scales (one a tile: value = e4m3 * scale), then the 64
rope values as bfloat16, unquantized. The reference is float64 over the dequantized rows, so a
kernel is judged on what it computes from the cache it reads, not on the quantization error."""
from __future__ import annotations

from pathlib import Path

from kernelsearch.families import mla
from kernelsearch.families.mla_sparse_decode import (HELDOUT, SEARCH, SWEEP, TINY, make_indices,
                                                     positions_to_rows, selected)

ROW_BYTES = 656  # 512 e4m3 + 4 x float32 + 64 x bfloat16
TILE = 128  # e4m3 values a scale covers
FP8_MAX = 448.0  # largest finite e4m3fn


def quantize(rows):
    """[N, 576] (any float dtype) -> [N, 656] uint8 in the V3.2 layout; each tile's scale is the
    power of two at or above amax / 448, as FlashMLA's tests quantize (exact to rescale)."""
    import torch

    n = rows.shape[0]
    out = torch.empty((n, ROW_BYTES), dtype=torch.uint8, device=rows.device)
    nope = out[:, :512].view(torch.float8_e4m3fn)
    scales = out[:, 512:528].view(torch.float32)
    out[:, 528:].view(torch.bfloat16).copy_(rows[:, 512:])
    for t in range(512 // TILE):
        tile = rows[:, t * TILE:(t + 1) * TILE].float()
        s = tile.abs().amax(dim=-1) / FP8_MAX
        s = torch.pow(2.0, torch.clamp_min(s, 1e-4).log2().ceil())
        scales[:, t] = s
        nope[:, t * TILE:(t + 1) * TILE] = (tile / s[:, None]).to(torch.float8_e4m3fn)
    return out


def dequantize(packed, dtype=None):
    """[..., 656] uint8 -> [..., 576] float32 (or `dtype`): e4m3 * its tile's scale, rope as is."""
    import torch

    lead = packed.shape[:-1]
    flat = packed.reshape(-1, ROW_BYTES)
    nope = flat[:, :512].view(torch.float8_e4m3fn).float().view(-1, 512 // TILE, TILE)
    scales = flat[:, 512:528].view(torch.float32)
    out = torch.cat([(nope * scales[:, :, None]).view(-1, 512),
                     flat[:, 528:].view(torch.bfloat16).float()], dim=1)
    out = out.view(*lead, mla.D_QK)
    return out if dtype is None else out.to(dtype)


def make_inputs(shape, dtype, device, gen, dist="normal"):
    """mla_sparse_decode's inputs with the cache quantized; every row nobody may read poisoned
    (e4m3 448 at scale 1, rope 300, as the bf16 families' POISON)."""
    import torch

    B, nh, L, page, topk, ragged = shape
    q, kv, table, lens = mla.decode_inputs(B, nh, L, page, ragged, dtype, device, gen, dist)
    idx = make_indices(B, L, page, topk, lens, ragged, gen)
    flat = kv.view(-1, mla.D_QK)
    packed = torch.empty((flat.shape[0], ROW_BYTES), dtype=torch.uint8, device=kv.device)
    for a in range(0, flat.shape[0], 1 << 20):  # in pieces: a 128 x 160k cache is 21M rows
        part = flat[a:a + (1 << 20)]
        q8 = quantize(part)
        bad = (part == mla.POISON).all(dim=1)
        q8[bad, :512] = 0x7E  # e4m3fn 448
        q8[bad, 512:528] = torch.tensor([1.0] * 4).view(torch.uint8).to(kv.device)
        q8[bad, 528:] = torch.full((64,), mla.POISON, dtype=torch.bfloat16).view(
            torch.uint8).to(kv.device)
        packed[a:a + (1 << 20)] = q8
    del kv, flat
    cache = packed.view(-1, page, ROW_BYTES)
    return (q, cache, table, lens.to(device), idx.to(device), mla.SCALE)


def reference(q, kv_cache, block_table, seq_lens, indices, scale, *, return_lse: bool = False):
    ok = selected(indices, seq_lens)
    rows = [mla.gather_rows(kv_cache, block_table[b:b + 1], indices[b:b + 1][ok[b:b + 1]]
                            .view(1, -1))[0] for b in range(q.shape[0])]
    import torch

    # only the selected rows are dequantized (all of a 128 x 160k cache in float64 is 97 GB)
    flat = kv_cache.reshape(-1, ROW_BYTES)
    deq = [dequantize(flat[r]).double() for r in rows]
    offsets = torch.tensor([0] + [len(r) for r in rows]).cumsum(0).tolist()
    compact = torch.cat(deq) if deq else torch.empty((0, mla.D_QK), dtype=torch.float64)
    local = [torch.arange(offsets[b], offsets[b + 1], device=q.device) for b in range(len(rows))]
    return mla.reference_rows(q, compact, local, scale, return_lse)


def torch_default(q, kv_cache, block_table, seq_lens, indices, scale, *,
                  return_lse: bool = False):
    """Gather the selected packed rows, dequantize only those (to q's dtype), then the dense
    torch path with the skipped slots masked (safe on every input mla_sparse_decode's is)."""
    import torch

    rows = positions_to_rows(kv_cache, block_table, seq_lens, indices)
    ok = rows >= 0
    packed = kv_cache.view(-1, ROW_BYTES)[torch.where(ok, rows.long(), 0)]
    kv = dequantize(packed, q.dtype)
    return mla.plain_attention(q, kv, ok, scale, return_lse)


def shape_of(q, kv_cache, block_table, seq_lens, indices, scale):
    if kv_cache.dim() != 3 or kv_cache.shape[-1] != ROW_BYTES or str(kv_cache.dtype) != \
            "torch.uint8" or not kv_cache.is_contiguous():
        raise ValueError(f"mla_fp8: kv_cache must be a contiguous uint8 [num_blocks, page, "
                         f"{ROW_BYTES}] (the V3.2 FP8 layout)")
    if kv_cache.data_ptr() % 16:  # read as float32 scales and bf16 rope too: aligned rows
        raise ValueError("mla_fp8: kv_cache must start 16-byte aligned")
    if q.dim() != 3 or q.shape[-1] != mla.D_QK or q.stride(-1) != 1:
        raise ValueError(f"mla_fp8: q must be [B, H, {mla.D_QK}] with unit last stride")
    B = q.shape[0]
    if block_table.dim() != 2 or block_table.shape[0] != B or seq_lens.shape != (B,):
        raise ValueError("mla_fp8: block_table must be [B, max_blocks] and seq_lens [B]")
    if indices.dim() != 2 or indices.shape[0] != B or str(indices.dtype) != "torch.int32":
        raise ValueError("mla_fp8: indices must be [B, topk] int32")
    # the kernel reads block_table and indices by their row strides and seq_lens densely (as
    # mla.check_common): column-strided tables or indices and strided lengths run torch
    if block_table.stride(-1) != 1 or seq_lens.stride(0) != 1 or indices.stride(-1) != 1:
        raise ValueError("mla_fp8: block_table and indices need unit last stride, seq_lens "
                         "unit stride")
    page = kv_cache.shape[1]
    return (B, q.shape[1], block_table.shape[1] * page, page, indices.shape[1], 1)


def n_tokens(s) -> float:
    B, L, topk, ragged = s[0], s[2], s[4], s[5]
    return float(B * min(topk, L)) if not ragged else float(B)


# `fitted` (fitted.py): one launch for the memory-bound head counts (16 / 32 a GPU), the
# split-KV schedule of mla_decode's `fitted` over the top-k tiles; its space is that variant's
# (head blocks up to 64 rows, never more than the heads need) over GRID 132 to 528 programs
FITTED = {**mla.FITTED_DIMS, "GRID": [132, 264, 528]}

FAMILY = mla.family(
    "mla_sparse_decode_fp8", "forward(q, kv_cache, block_table, seq_lens, indices, scale)",
    Path(__file__).parent, {"rows": {}, "fitted": FITTED},
    n_tokens=n_tokens, int32_reads=lambda s: s[0] * s[4] * 4 + s[0] * 4, row_bytes=ROW_BYTES,
    shape_dims=("B", "H", "L", "P", "TOPK", "R"), exact_dims=("H", "P", "TOPK"),
    cheap=(1, 16, 100, 16, 33, 1), search=SEARCH, sweep=SWEEP, heldout=HELDOUT, tiny=TINY,
    make_inputs=make_inputs, reference=reference, torch_default=torch_default,
    shape_of=shape_of)
