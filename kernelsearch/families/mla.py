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
exact), 1 = ragged, 1..L, sequence 0 at L and sequence 1 one token past a page."""
from __future__ import annotations

import math

from kernelsearch.families.base import randn

D_LATENT = 512  # kv_lora_rank: the V width
D_ROPE = 64  # qk_rope_head_dim
D_QK = D_LATENT + D_ROPE  # 576: the K width
SCALE = 1.0 / math.sqrt(128 + 64)  # DeepSeek-V3: 1/sqrt(qk_nope + qk_rope head dim)
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
    return lens


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


def reference_rows(q, kv_cache, rows_per_seq, scale):
    """float64 attention of each sequence over the given physical cache rows."""
    import torch

    flat = kv_cache.reshape(-1, D_QK)
    out = []
    for b, rows in enumerate(rows_per_seq):
        kv = flat[rows].double()
        s = (q[b].double() @ kv.T) * scale
        out.append(torch.softmax(s, dim=-1) @ kv[:, :D_LATENT])
    return torch.stack(out)


def plain_attention(q, kv, mask, scale):
    """The torch path a user writes: bmm(q, kv^T) -> float softmax -> bmm(p, kv[..., :512]).
    kv [B, N, 576] gathered, mask [B, N] True where a token is attended."""
    import torch

    s = torch.bmm(q, kv.transpose(1, 2)).float() * scale
    s = s.masked_fill(~mask[:, None, :], float("-inf"))
    p = torch.softmax(s, dim=-1).to(q.dtype)
    return torch.bmm(p, kv[..., :D_LATENT])


def check_common(q, kv_cache, block_table, seq_lens) -> tuple[int, int, int, int]:
    """(B, H, capacity, page); ValueError for inputs the kernels do not take (dispatch then
    runs torch)."""
    if q.dim() != 3 or q.shape[-1] != D_QK or q.stride(-1) != 1:
        raise ValueError(f"mla: q must be [B, H, {D_QK}] with unit last stride, got "
                         f"{tuple(q.shape)}")
    if kv_cache.dim() != 3 or kv_cache.shape[-1] != D_QK or not kv_cache.is_contiguous():
        raise ValueError(f"mla: kv_cache must be a contiguous [num_blocks, page, {D_QK}]")
    B = q.shape[0]
    if block_table.dim() != 2 or block_table.shape[0] != B or seq_lens.shape != (B,):
        raise ValueError("mla: block_table must be [B, max_blocks] and seq_lens [B]")
    if str(block_table.dtype) != "torch.int32" or str(seq_lens.dtype) != "torch.int32":
        raise ValueError("mla: block_table and seq_lens must be int32")
    page = kv_cache.shape[1]
    return B, q.shape[1], block_table.shape[1] * page, page


def per_sequence_rms(ref):
    """Each sequence's own output scale (Family.scale_of): a ragged batch mixes one-token
    sequences (outputs O(1)) with 128k-token ones (outputs ~1e-2), and the bf16 rounding of p
    errs in proportion to each sequence's own values."""
    return ref.pow(2).mean(dim=(1, 2), keepdim=True).sqrt()
