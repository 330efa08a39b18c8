"""MLA decode with several query tokens a step (multi-token prediction: DeepSeek-V3's MTP decodes
s_q = 2): forward(q, kv_cache, block_table, seq_lens, scale) with q [B, s_q, H, 576] (FlashMLA's
layout), the paged latent cache and block table of mla_decode, seq_lens [B] int32 counting the
step's own s_q tokens (already in the cache). Causal within the step, as FlashMLA's causal=True:
query token j attends positions < seq_lens[b] - (s_q - 1 - j); one with nothing to attend (a
sequence shorter than s_q) gets output 0. out [B, s_q, H, 512] in q's dtype."""
from __future__ import annotations

from pathlib import Path

from kernelsearch.families import mla
from kernelsearch.families.base import Variant
from kernelsearch.families.mla_decode import page_mask

H = 128
S_Q = 2

# (B, H, L, page, s_q, R): as mla_decode, with the query tokens a step
# the tensor-parallel heads (16 / 32 / 64 a GPU) at s_q 1 and 2, full and ragged batches
SWEEP = ([(b, H, n, 64, S_Q, 0) for b in (1, 8, 32, 64) for n in mla.CONTEXTS]
         + [(b, h, n, 64, sq, 0) for h in mla.SMALL_HEADS for sq in (1, 2) for b in (8, 32, 128)
            for n in mla.CONTEXTS]
         + [(b, h, n, 64, sq, 1) for h in mla.SMALL_HEADS for sq in (1, 2)
            for b, n in ((32, 32768), (64, 131072))])
SEARCH = [(64, H, 4096, 64, S_Q, 0), (32, H, 32768, 64, S_Q, 0), (8, H, 131072, 64, S_Q, 0),
          (64, 16, 4096, 64, S_Q, 0), (32, 16, 32768, 64, S_Q, 1), (8, 32, 131072, 64, S_Q, 0),
          (64, 32, 32768, 64, 1, 1), (32, 64, 32768, 64, S_Q, 0)]
HELDOUT = [(7, H, 5000, 64, S_Q, 1), (3, H, 2049, 16, S_Q, 1), (33, H, 8193, 64, S_Q, 1),
           (9, 16, 7000, 64, S_Q, 1), (5, 32, 3001, 16, 1, 1), (17, 64, 20000, 64, S_Q, 1)]
# lengths just past a page (16, 64) and past a 16-token tile; ragged ones include length 1
# (16 heads x 2 tokens: one 32-row tile), one query token, and 32 heads
TINY = [(2, 16, 80, 16, S_Q, 1), (3, 4, 130, 64, S_Q, 1), (2, 8, 33, 1, S_Q, 1),
        (1, 16, 17, 16, S_Q, 0), (3, 16, 70, 16, 1, 1), (3, 32, 40, 16, S_Q, 1)]


def make_inputs(shape, dtype, device, gen, dist="normal"):
    from kernelsearch.families.base import randn

    B, nh, L, page, sq, ragged = shape
    lens = mla.seq_lens_for(B, L, page, ragged, gen)
    if ragged and B > 2:
        lens[2] = 1  # shorter than the step: its first query token attends nothing
    q = randn((B, sq * nh, mla.D_QK), dtype, device, gen, dist)
    kv, table = mla.paged_cache(B, L, page, lens, dtype, device, gen, dist)
    return (q.view(B, sq, nh, mla.D_QK), kv, table, lens.to(device), mla.SCALE)


def limits(seq_lens, sq: int):
    """[B, s_q]: how many leading positions query token j attends."""
    import torch

    j = torch.arange(sq, device=seq_lens.device)
    return (seq_lens[:, None] - (sq - 1 - j)[None, :]).clamp_min(0)


def reference(q, kv_cache, block_table, seq_lens, scale, *, return_lse: bool = False):
    """float64, one query token at a time over its own prefix."""
    import torch

    B, sq = q.shape[0], q.shape[1]
    lim = limits(seq_lens, sq).tolist()
    outs, lses = [], []
    for j in range(sq):
        rows = []
        for b in range(B):
            pos = torch.arange(lim[b][j], device=q.device)[None, :]
            rows.append(mla.gather_rows(kv_cache, block_table[b:b + 1], pos)[0])
        o, lse = mla.reference_rows(q[:, j], kv_cache, rows, scale, return_lse=True)
        outs.append(o)
        lses.append(lse)
    out = torch.stack(outs, dim=1)
    # LSE [B, H, s_q], FlashMLA's softmax_lse layout
    return (out, torch.stack(lses, dim=-1)) if return_lse else out


def torch_default(q, kv_cache, block_table, seq_lens, scale, *, return_lse: bool = False):
    """The dense torch path with one mask per query row (token j: its causal prefix); every
    input FlashMLA's tests use is safe as in mla_decode. LSE [B, H, s_q] float32."""
    import torch

    B, sq, nh = q.shape[0], q.shape[1], q.shape[2]
    kv, _ = page_mask(kv_cache, block_table, seq_lens)
    pos = torch.arange(kv.shape[1], device=kv.device)
    lim = limits(seq_lens.clamp(0, kv.shape[1]), sq)  # [B, s_q]
    mask = (pos[None, None, :] < lim[:, :, None]).repeat_interleave(nh, dim=1)  # [B, s_q*H, N]
    res = mla.plain_attention(q.reshape(B, sq * nh, mla.D_QK), kv, mask, scale, return_lse)
    if not return_lse:
        return res.view(B, sq, nh, mla.D_LATENT)
    out, lse = res
    return out.view(B, sq, nh, mla.D_LATENT), lse.view(B, sq, nh).transpose(1, 2)


def shape_of(q, kv_cache, block_table, seq_lens, scale):
    if q.dim() != 4 or q.shape[-1] != mla.D_QK or q.stride(-1) != 1:
        raise ValueError(f"mla_mtp: q must be [B, s_q, H, {mla.D_QK}] with unit last stride, "
                         f"got {tuple(q.shape)}")
    B, nh, cap, page = mla.check_common(q[:, 0], kv_cache, block_table, seq_lens)
    return (B, nh, cap, page, q.shape[1], 1)


def n_tokens(s) -> float:
    """Tokens of the cache read, fewest possible (every query row of a sequence reads them)."""
    B, L, ragged = s[0], s[2], s[5]
    return float(B * L) if not ragged else float(L + B - 1)


FAMILY = mla.family(
    "mla_decode_mtp", "forward(q, kv_cache, block_table, seq_lens, scale)",
    Path(__file__).parent, {"splitkv": {}},
    n_tokens=n_tokens, int32_reads=lambda s: s[0] * 4, q_rows=lambda s: s[1] * s[4],
    shape_dims=("B", "H", "L", "P", "S", "R"), exact_dims=("H", "P", "S"),
    cheap=(1, 16, 17, 16, S_Q, 1), search=SEARCH, sweep=SWEEP, heldout=HELDOUT, tiny=TINY,
    make_inputs=make_inputs, reference=reference, torch_default=torch_default,
    shape_of=shape_of)

# the fitted split-KV schedule: mla_decode's file, which takes this layout too (s_q * H rows,
# both tokens of a 16-head step in one 32-row tile)
FAMILY.variants["fitted"] = Variant(
    "fitted", Path(__file__).parent.parent / "mla_decode" / "fitted.py",
    mla.tile_dims(**mla.FITTED_DIMS), mla.rows_tile_valid(lambda s: s[1] * s[4]))
