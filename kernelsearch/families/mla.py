"""Shared pieces of the DeepSeek MLA decode families (mla_decode, mla_sparse_decode): the paged
latent cache as serving engines store it, its float64 reference and the plain torch path.

Absorbed MLA decode (kernelsearch/context/models/deepseek-mla.md): every query head attends to
the same cached 576-wide latent per token (512 compressed + 64 rope); K is all 576 columns, V the
first 512. The cache is paged: kv_cache [num_blocks, page, 576], block_table [B, max_blocks]
int32 maps a sequence's token t to row (block_table[b, t // page], t % page); seq_lens [B] int32.

Inputs always come with the pages shuffled (a non-contiguous block table, spare pages between
them) and every cache row a sequence must not read (past its length, spare pages) filled with a
large value, so a kernel that reads one is wrong by far. `R` in a shape says how long the
sequences are: 0 = every sequence at the capacity L (what timing measures, so the bytes model is
exact), 1 = ragged, 1..L, sequence 0 at L and sequence 1 one token past a page.

`family(...)` builds either family's `Family` from what differs (shapes, inputs, reference,
torch path, tokens attended, variant files); the tile space, its validity rule, the bytes and
FLOP models and the judge's settings are the same for both."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable, Sequence

from kernelsearch.families.base import Family, Scalar, Variant, randn

D_LATENT = 512  # kv_lora_rank: the V width
D_ROPE = 64  # qk_rope_head_dim
D_QK = D_LATENT + D_ROPE  # 576: the K width
# The softmax scale is always passed; nothing defaults it. DeepSeek-V3's model scale is
# 1/sqrt(qk_nope + qk_rope) = 1/sqrt(192) (what the families' inputs use; YaRN's mscale**2 on top
# for long-context checkpoints). FlashMLA's softmax_scale=None means 1/sqrt(head_dim_k) =
# 1/sqrt(576), what its tests use: a user porting from FlashMLA passes its scale explicitly.
SCALE = 1.0 / math.sqrt(128 + 64)
FLASHMLA_DEFAULT_SCALE = 1.0 / math.sqrt(D_QK)
# the softmax scales users pass: this family's default, DeepSeek-V3's (1/sqrt(192) times its
# YaRN mscale^2: 0.1352), the project's tiny preset (1/sqrt(16 + 64)), FlashMLA's tests'
# (1/sqrt(576)); then anything a model with other head dims may use
SCALES = Scalar((1.0 / math.sqrt(192), 0.1352, 1.0 / math.sqrt(80), 1.0 / math.sqrt(576)),
                0.02, 0.25)
# heads a GPU holds: DeepSeek-V3/V3.2 tensor-parallel over 8 / 4 / 2 GPUs, and one GPU (all 128).
# Below 128 heads decode is memory-bound (16 heads: 30 FLOP a byte, the H200 breaks even at 171)
HEADS = (16, 32, 64, 128)
SMALL_HEADS = HEADS[:-1]
# the contexts the round-3 tables cover, 4k to 128k
CONTEXTS = (4096, 32768, 131072)
POISON = 300.0  # what rows nobody may read hold: exp(scale * 576 * 300 * q) swamps any softmax


def capacity(L: int, page: int) -> int:
    return -(-L // page) * page


def seq_lens_for(B: int, L: int, page: int, ragged: int, gen):
    import torch

    if not ragged:
        return torch.full((B,), L, dtype=torch.int32)
    lens = torch.randint(1, L + 1, (B,), generator=gen, dtype=torch.int32)
    lens[0] = L
    if B > 1:
        lens[1] = min(L, page + 1)
    # the longest sequence (and the one just past a page) at random positions of the batch
    return lens[torch.randperm(B, generator=gen)].contiguous()


def paged_cache(B: int, L: int, page: int, lens, dtype, device, gen, dist: str):
    """kv_cache with the sequences' pages shuffled among spare ones, and its block table."""
    import torch

    mb = -(-L // page)
    spare = max(1, mb // 4)
    nblocks = B * mb + spare
    perm = torch.randperm(nblocks, generator=gen)
    table = perm[:B * mb].view(B, mb).to(torch.int32)
    kv = randn((nblocks, page, D_QK), dtype, device, gen, dist)
    # poison every row no sequence may read: tails past each length and the spare pages
    valid = torch.zeros(nblocks * page, dtype=torch.bool)
    pos = torch.arange(mb * page)
    for b in range(B):
        rows = table[b].long()[pos // page] * page + pos % page
        valid[rows[pos < int(lens[b])]] = True
    kv.view(-1, D_QK)[~valid.to(device)] = POISON
    return kv, table.to(device)


def gather_rows(kv_cache, block_table, pos):
    """Physical row of each token position pos [B, N] (any position < capacity)."""
    page = kv_cache.shape[1]
    blk = block_table.gather(1, (pos // page).long())
    return blk.long() * page + pos.long() % page


def safe_rows(kv_cache, block_table, pos, ok):
    """gather_rows for positions where `ok`, row 0 elsewhere: a block-table slot no read token
    sits in may hold anything (FlashMLA's tests fill unused slots with 2147480000), and a
    position may be anything where it is not attended (-1, past the length)."""
    import torch

    cap = block_table.shape[1] * kv_cache.shape[1]
    rows = gather_rows(kv_cache, block_table, torch.where(ok, pos, 0).clamp(0, cap - 1))
    nrows = kv_cache.shape[0] * kv_cache.shape[1]
    return torch.where(ok & (rows >= 0) & (rows < nrows), rows, 0)


def reference_rows(q, kv_cache, rows_per_seq, scale, return_lse: bool = False):
    """float64 attention of each sequence over the given physical cache rows (q[b] [M, 576]:
    the heads, or heads x query tokens); a sequence with no row attends nothing: output 0 and
    LSE +inf (FlashMLA's convention for an empty softmax)."""
    import torch

    flat = kv_cache.reshape(-1, kv_cache.shape[-1])
    out, lses = [], []
    for b, rows in enumerate(rows_per_seq):
        kv = flat[rows].double()
        s = (q[b].double() @ kv.T) * scale
        out.append(torch.softmax(s, dim=-1) @ kv[:, :D_LATENT] if len(rows)
                   else torch.zeros(q.shape[1:-1] + (D_LATENT,), dtype=torch.float64,
                                    device=q.device))
        lses.append(torch.logsumexp(s, dim=-1) if len(rows)
                    else torch.full(q.shape[1:-1], float("inf"), dtype=torch.float64,
                                    device=q.device))
    return (torch.stack(out), torch.stack(lses)) if return_lse else torch.stack(out)


def plain_attention(q, kv, mask, scale, return_lse: bool = False):
    """The torch path a user writes: bmm(q, kv^T) -> float softmax -> bmm(p, kv[..., :512]),
    made safe for any input a serving engine passes. kv [B, N, 576] gathered (a fresh tensor:
    it is overwritten), mask [B, N] (or [B, M, N], per query row) True where a token is attended.
    Rows not attended are zeroed first (they may hold NaN: 0 * NaN is NaN in p @ V), and a row of
    q that attends nothing gets output 0 and LSE +inf instead of softmax's NaN. LSE is natural,
    of the scaled scores, float32 [B, M] (vLLM and SGLang merge partial attentions with it)."""
    import torch

    m3 = mask[:, None, :] if mask.dim() == 2 else mask
    kv.masked_fill_(~mask.any(dim=1)[..., None] if mask.dim() == 3 else ~mask[..., None], 0)
    s = torch.bmm(q, kv.transpose(1, 2)).float() * scale
    s = s.masked_fill(~m3, float("-inf"))
    p = torch.softmax(s, dim=-1).masked_fill(~m3, 0.0).to(q.dtype)
    out = torch.bmm(p, kv[..., :D_LATENT])
    if not return_lse:
        return out
    lse = torch.logsumexp(s, dim=-1)
    return out, lse.masked_fill(~m3.any(dim=-1), float("inf"))


def check_common(q, kv_cache, block_table, seq_lens) -> tuple[int, int, int, int]:
    """(B, H, capacity, page); ValueError for inputs the kernels do not take (dispatch then
    runs torch)."""
    if q.dim() != 3 or q.shape[-1] != D_QK or q.stride(-1) != 1:
        raise ValueError(f"mla: q must be [B, H, {D_QK}] with unit last stride, got "
                         f"{tuple(q.shape)}")
    if kv_cache.dim() != 3 or kv_cache.shape[-1] != D_QK or not kv_cache.is_contiguous():
        raise ValueError(f"mla: kv_cache must be a contiguous [num_blocks, page, {D_QK}]")
    # the Gluon kernels read it by TMA or 16-byte cp.async (serving engines allocate it aligned)
    if kv_cache.data_ptr() % 16:
        raise ValueError("mla: kv_cache must start 16-byte aligned")
    B = q.shape[0]
    if block_table.dim() != 2 or block_table.shape[0] != B or seq_lens.shape != (B,):
        raise ValueError("mla: block_table must be [B, max_blocks] and seq_lens [B]")
    if str(block_table.dtype) != "torch.int32" or str(seq_lens.dtype) != "torch.int32":
        raise ValueError("mla: block_table and seq_lens must be int32")
    # the kernels index block_table by its row stride and read seq_lens densely: a row slice
    # of a larger table (vLLM's) is fine; a column-strided table or strided lengths run torch
    if block_table.stride(-1) != 1 or seq_lens.stride(0) != 1:
        raise ValueError("mla: block_table needs unit last stride and seq_lens unit stride")
    page = kv_cache.shape[1]
    return B, q.shape[1], block_table.shape[1] * page, page


def per_sequence_rms(ref):
    """Each sequence's own output scale (Family.scale_of): a ragged batch mixes one-token
    sequences (outputs O(1)) with 128k-token ones (outputs ~1e-2), and the bf16 rounding of p
    errs in proportion to each sequence's own values. ref [B, ..., 512]."""
    return ref.pow(2).mean(dim=tuple(range(1, ref.dim())), keepdim=True).sqrt()


def decode_inputs(B: int, nh: int, L: int, page: int, ragged: int, dtype, device, gen, dist):
    """(q, kv_cache, block_table, seq_lens on the CPU): the inputs both families share, drawn in
    this order from `gen`."""
    lens = seq_lens_for(B, L, page, ragged, gen)
    q = randn((B, nh, D_QK), dtype, device, gen, dist)
    kv, table = paged_cache(B, L, page, lens, dtype, device, gen, dist)
    return q, kv, table, lens


# the tile space of every MLA variant: a head block x token block program, its split-KV grid
TILE_DIMS = {"BLOCK_H": [16, 32, 64, 128], "BLOCK_N": [16, 32, 64],
             "GRID": [132, 264, 528, 1056], "STAGES": [1, 2, 3], "num_warps": [4, 8, 16]}


def tile_dims(**changes: list) -> dict[str, list]:
    """TILE_DIMS with `changes`; a new parameter goes before num_warps (launch options last)."""
    dims = {k: list(changes.get(k, v)) for k, v in TILE_DIMS.items() if k != "num_warps"}
    dims.update({k: list(v) for k, v in changes.items() if k not in TILE_DIMS})
    dims["num_warps"] = list(changes.get("num_warps", TILE_DIMS["num_warps"]))
    return dims


def tile_valid(cfg: dict, shape) -> bool:
    """A head block no larger than needed (masked heads are wasted tensor-core rows, 16 is
    tl.dot's least M); the [BLOCK_H, 512] fp32 accumulator at most 128 registers a thread; the
    loaded K tiles of every stage and q within the 227 KiB of shared memory a program gets."""
    nh = shape[1]
    bh, bn = cfg["BLOCK_H"], cfg["BLOCK_N"]
    if bh > max(16, 1 << (nh - 1).bit_length()):
        return False
    if bh * 512 // (32 * cfg["num_warps"]) > 128:
        return False
    return cfg["STAGES"] * bn * D_QK * 2 + bh * D_QK * 2 <= 227 * 1024


def rows_tile_valid(q_rows: Callable[[Any], int]) -> Callable[[dict, Any], bool]:
    """tile_valid over a sequence's query rows (heads x query tokens): the memory-bound
    `fitted` variant packs both tokens of a multi-token step into one tile (16 heads x 2: one
    32-row MMA tile), so its head block is bounded by the rows, not the heads."""
    def valid(cfg: dict, shape) -> bool:
        return tile_valid(cfg, (shape[0], q_rows(shape)) + tuple(shape[2:]))
    return valid


# the fitted split-KV variant's space (mla_decode/fitted.py, shared by mla_decode_mtp): head
# blocks up to 64 rows (the memory-bound head counts), GRID programs sharing the batch's tiles
FITTED_DIMS = {"BLOCK_H": [16, 32, 64], "BLOCK_N": [16, 32, 64],
               "GRID": [132, 264, 528, 1056], "STAGES": [1, 2, 3], "num_warps": [4, 8]}


def family(name: str, signature: str, here: Path, variants: dict[str, dict[str, list]], *,
           n_tokens: Callable[[Any], float], int32_reads: Callable[[Any], int],
           shape_dims: Sequence[str], exact_dims: Sequence[str], cheap, search, sweep,
           heldout, tiny, make_inputs, reference, torch_default, shape_of,
           q_rows: Callable[[Any], int] = lambda s: s[1], row_bytes: int | None = None,
           dtypes: tuple[str, ...] = ("bfloat16", "float16")) -> Family:
    """An MLA decode family. `variants`: file stem -> its changes to TILE_DIMS; `n_tokens(s)`:
    tokens attended at shape s, fewest possible (what bytes and FLOPs count); `int32_reads(s)`:
    the int32 index bytes read besides the cache (seq_lens, indices); `q_rows(s)`: query rows a
    sequence (its heads, times the query tokens for s_q > 1); `row_bytes`: cache bytes a token
    (None: 576 elements of q's dtype; 656 for the V3.2 FP8 layout). Shapes start (B, H, L, P)."""
    def bytes_moved(s, es):
        B, rows = s[0], q_rows(s)
        cache = row_bytes if row_bytes is not None else D_QK * es
        return n_tokens(s) * cache + B * rows * (D_QK + D_LATENT) * es + int32_reads(s)

    def flops(s):
        return 2.0 * q_rows(s) * n_tokens(s) * (D_QK + D_LATENT)

    return Family(
        name=name,
        signature=signature,
        dtypes=dtypes,
        variants={v: Variant(v, here / f"{v}.py", tile_dims(**changes), tile_valid)
                  for v, changes in variants.items()},
        search_shapes=search,
        sweep_shapes=sweep,
        heldout_shapes=heldout,
        tiny_shapes=tiny,
        make_inputs=make_inputs,
        reference=reference,
        torch_default=torch_default,
        out_spec=lambda q, *a: ((*q.shape[:-1], D_LATENT), q.dtype),
        bytes_moved=bytes_moved,
        flops=flops,
        shape_of=shape_of,
        shape_dims=tuple(shape_dims),
        exact_dims=tuple(exact_dims),
        range_dims=("B", "L"),
        bound="compute",
        scale_of=per_sequence_rms,
        # lengths just past a 64-token page/tile, a 256-token chunk and a 1024-token split;
        # batch past the few a grid may cap at, heads past a 16/64-head block, top-k past a
        # 64/256-index tile and DeepSeek-V3.2's 2048; page counts past 64/256/1024/4096 pages
        # (pages of one token). The CPU interpreter runs the cheap ones (the GPU all, plus the
        # largest claimed shape)
        edges={"L": (64, 256, 1024), "B": (2, 8, 32, 128), "H": HEADS,
               "TOPK": (64, 256, 2048)},
        edge_shapes=[tuple(cheap[:2]) + (n + 1, 1) + tuple(cheap[4:])
                     for n in (64, 256, 1024, 4096)],
        cheap=cheap,
        interp_max={"L": 257, "B": 3, "H": 17, "TOPK": 257},
        scalars={len(signature.split(",")) - 1: SCALES},
        lengths_arg=3,
        batch_args=tuple(i for i, a in enumerate(signature[8:-1].split(", "))
                         if a in ("q", "block_table", "seq_lens", "indices")),
    )
