"""FlashMLA's input layouts, one adapter each, from the MLA families' arguments (a paged latent
cache [blocks, page, 576], block_table [B, max_blocks] int32, seq_lens [B] int32, indices
[B, topk] token positions). What each costs is said beside it: benchmarks time FlashMLA on
converted inputs and report the conversion on its own.

- `dense`: the block-table layout of flash_mla_with_kvcache (q [B, 1, H, 576], cache [blocks,
  page, 1, 576], block_table and cache_seqlens int32). Views only: free, for the dense,
  16-byte-aligned tensors an engine allocates.
- `aligned`: FlashMLA's TMA descriptors and vector loads need dense, 16-byte-aligned inputs (on
  the H200 an unaligned or row-strided view faults: "TMA Desc Addr" / misaligned address, a
  SIGSEGV that takes the process down). A view that is not gets copied into a fresh tensor;
  one that is passes through untouched, so the timed calls never copy.
- `physical_rows`: the sparse kernels' indices, physical cache rows block * page + offset
  ([B, 1, topk] int32, -1 where a slot is unused or past the length). One small gather.
- `fp8_rows` / `fp8_cache`: DeepSeek-V3.2's FP8 cache row of 656 bytes (512 float8_e4m3 values
  in four tiles of 128, each with its float32 scale, then the 64 rope values in bf16), as
  FlashMLA's FP8 sparse decode reads it. A quantization pass over the cache: an engine writes
  rows in this format as it appends them, so it is never part of a timed decode step."""
from __future__ import annotations

from typing import Any

D_NOPE, D_ROPE, FP8_ROW = 512, 64, 656
E4M3_MAX = 448.0


ALIGN = 16  # bytes: a TMA descriptor's global address and strides


def aligned(t: Any) -> Any:
    """t itself when dense and 16-byte aligned, else a fresh dense copy (the caching allocator's
    blocks are 512-byte aligned)."""
    if t.is_contiguous() and t.data_ptr() % ALIGN == 0:
        return t
    import torch

    return t.clone(memory_format=torch.contiguous_format)


def dense(q: Any, kv_cache: Any, block_table: Any, seq_lens: Any) -> tuple:
    q, kv_cache, block_table, seq_lens = (aligned(t) for t in (q, kv_cache, block_table,
                                                                 seq_lens))
    B, H, D = q.shape
    return (q.view(B, 1, H, D), kv_cache.view(kv_cache.shape[0], kv_cache.shape[1], 1, D),
            block_table, seq_lens)


def physical_rows(kv_cache: Any, block_table: Any, seq_lens: Any, indices: Any) -> Any:
    import torch

    page = kv_cache.shape[1]
    cap = block_table.shape[1] * page
    pos = indices.clamp(0, cap - 1).long()
    rows = block_table.gather(1, pos // page).long() * page + pos % page
    ok = (indices >= 0) & (indices < seq_lens[:, None])
    return torch.where(ok, rows, -1).to(torch.int32).unsqueeze(1)


def fp8_rows(x: Any) -> Any:
    """bf16/fp16 rows [N, 576] -> [N, 656] uint8 in the V3.2 FP8 layout."""
    import torch

    n = x.shape[0]
    out = torch.empty((n, FP8_ROW), dtype=torch.uint8, device=x.device)
    nope = out[:, :D_NOPE].view(torch.float8_e4m3fn)
    scales = out[:, D_NOPE:D_NOPE + 16].view(torch.float32)
    out[:, D_NOPE + 16:].view(torch.bfloat16).copy_(x[:, D_NOPE:].to(torch.bfloat16))
    for t in range(4):
        tile = x[:, t * 128:(t + 1) * 128].float()
        s = (tile.abs().amax(dim=-1) / E4M3_MAX).clamp_min(1e-10)
        scales[:, t] = s
        nope[:, t * 128:(t + 1) * 128] = (tile / s[:, None]).to(torch.float8_e4m3fn)
    return out


def fp8_dequantize(r: Any) -> Any:
    """[N, 656] uint8 -> the bf16 rows [N, 576] FlashMLA computes with (for the reference)."""
    import torch

    out = torch.empty((r.shape[0], D_NOPE + D_ROPE), dtype=torch.bfloat16, device=r.device)
    nope = r[:, :D_NOPE].view(torch.float8_e4m3fn)
    scales = r[:, D_NOPE:D_NOPE + 16].view(torch.float32)
    out[:, D_NOPE:] = r[:, D_NOPE + 16:].view(torch.bfloat16)
    for t in range(4):
        out[:, t * 128:(t + 1) * 128] = (nope[:, t * 128:(t + 1) * 128].float()
                                         * scales[:, t:t + 1]).to(torch.bfloat16)
    return out


def fp8_cache(kv_cache: Any, chunk: int = 1 << 20) -> Any:
    """The whole paged cache [blocks, page, 576] as FP8 rows [blocks, page, 1, 656]."""
    import torch

    nb, page, _ = kv_cache.shape
    flat = kv_cache.reshape(-1, D_NOPE + D_ROPE)
    out = torch.empty((flat.shape[0], FP8_ROW), dtype=torch.uint8, device=kv_cache.device)
    for a in range(0, flat.shape[0], chunk):
        out[a:a + chunk] = fp8_rows(flat[a:a + chunk])
    return out.view(nb, page, 1, FP8_ROW)
