"""MLA decode (DeepSeek-V2/V3/R1, absorbed): forward(q, kv_cache, block_table, seq_lens, scale)
with q [B, H, 576], a paged latent cache kv_cache [num_blocks, page, 576], block_table
[B, max_blocks] int32, seq_lens [B] int32 (0..capacity; 0 gives output 0); out [B, H, 512] in q's
dtype. `scale` is always passed (mla.py: DeepSeek-V3's 1/sqrt(192), FlashMLA's default 1/sqrt(576)).
K = all 576 columns, V = the first 512 (kernelsearch/families/mla.py). Compute-bound: 128 heads
share each loaded latent row (242 FLOP per byte, past the H200's 171)."""
from __future__ import annotations

from pathlib import Path

from kernelsearch.families import mla
from kernelsearch.families.base import Variant

H = 128  # DeepSeek-V3's heads (one GPU holds all of them; tensor parallel 8 gives 16)

# (B, H, L, page, R): L the context (capacity), R 0 = every sequence at L, 1 = ragged
# the table's grid: every (B, L) corner a dispatch range ends on, plus the shapes
SWEEP = ([(b, H, n, 64, 0) for b in (1, 4, 16, 32, 64, 128)
          for n in (4096, 16384, 32768, 131072, 163840)]
         + [(8, H, 4096, 64, 0), (8, H, 131072, 64, 0), (128, H, 2048, 64, 0)]
         # tensor-parallel heads a GPU (16 / 32 / 64), memory-bound: full and ragged batches
         + [(b, h, n, 64, 0) for h in mla.SMALL_HEADS for b in (8, 32, 128)
            for n in mla.CONTEXTS]
         + [(b, h, n, 64, 1) for h in mla.SMALL_HEADS for b, n in ((32, 32768), (64, 131072))])
SEARCH = [(64, H, 4096, 64, 0), (32, H, 32768, 64, 0), (8, H, 131072, 64, 0),
          (128, H, 2048, 64, 0), (1, H, 163840, 64, 0), (8, H, 4096, 64, 0),
          (64, 16, 4096, 64, 0), (32, 16, 32768, 64, 1), (8, 32, 131072, 64, 0),
          (64, 32, 32768, 64, 1), (32, 64, 32768, 64, 0)]
# never searched: ragged lengths, other page sizes, odd contexts just past a page and a split
HELDOUT = [(7, H, 5000, 64, 1), (3, H, 40961, 16, 1), (2, H, 2049, 1, 1), (33, H, 8193, 64, 1),
           (1, 16, 1000, 64, 1), (128, H, 1025, 64, 1), (9, 32, 7000, 64, 1),
           (5, 64, 3001, 16, 1), (17, 16, 20000, 64, 1)]
# CPU interpreter: lengths just past a page (16, 64) and past a 16/32-token tile
# and the tensor-parallel head counts (16 and 32 heads: one or two 16-row tiles)
TINY = [(2, 16, 80, 16, 1), (3, 4, 130, 64, 1), (2, 8, 33, 1, 1), (1, 16, 17, 16, 0),
        (3, 32, 70, 16, 1)]


def make_inputs(shape, dtype, device, gen, dist="normal"):
    B, nh, L, page, ragged = shape
    q, kv, table, lens = mla.decode_inputs(B, nh, L, page, ragged, dtype, device, gen, dist)
    return (q, kv, table, lens.to(device), mla.SCALE)


def reference(q, kv_cache, block_table, seq_lens, scale, *, return_lse: bool = False):
    import torch

    rows = []
    for b, n in enumerate(seq_lens.tolist()):
        pos = torch.arange(max(n, 0), device=q.device)[None, :]
        rows.append(mla.gather_rows(kv_cache, block_table[b:b + 1], pos)[0])
    return mla.reference_rows(q, kv_cache, rows, scale, return_lse)


def page_mask(kv_cache, block_table, seq_lens):
    """(kv [B, capacity, 576] gathered, mask [B, capacity]): the pages each sequence reads, any
    value in the block-table slots past its length (FlashMLA's tests: 2147480000) replaced by
    page 0 before the gather, so nothing faults; no host sync (it replays in a CUDA graph)."""
    import torch

    B, mb = block_table.shape
    page = kv_cache.shape[1]
    lens = seq_lens.clamp(0, mb * page)
    used = torch.arange(mb, device=block_table.device)[None, :] * page < lens[:, None]
    bt = torch.where(used, block_table, 0).clamp(0, kv_cache.shape[0] - 1)
    kv = kv_cache[bt.long()].view(B, -1, kv_cache.shape[-1])
    pos = torch.arange(mb * page, device=kv.device)
    return kv, pos[None, :] < lens[:, None]


def torch_default(q, kv_cache, block_table, seq_lens, scale, *, return_lse: bool = False):
    """The torch path over the gathered pages, masked past each length: the dispatch fallback,
    safe on every input FlashMLA's tests use (unused block-table slots holding anything, NaN in
    unread rows, zero-length sequences: output 0). return_lse: also the softmax LSE [B, H]
    (natural log of the scaled scores, float32; +inf where nothing is attended, as FlashMLA)."""
    kv, mask = page_mask(kv_cache, block_table, seq_lens)
    return mla.plain_attention(q, kv, mask, scale, return_lse)


def shape_of(q, kv_cache, block_table, seq_lens, scale):
    """(B, H, capacity, page, 1): the lengths are on the device, so every call counts as
    ragged (an entry covers ragged calls up to its context)."""
    B, nh, cap, page = mla.check_common(q, kv_cache, block_table, seq_lens)
    return (B, nh, cap, page, 1)


def n_tokens(s) -> float:
    """Tokens attended, fewest possible: all of them at R=0, at least one per sequence at R=1."""
    B, L, ragged = s[0], s[2], s[4]
    return float(B * L) if not ragged else float(L + B - 1)


FAMILY = mla.family(
    "mla_decode", "forward(q, kv_cache, block_table, seq_lens, scale)", Path(__file__).parent,
    {"splitkv": {}, "tma": {"BLOCK_N": [16, 32, 64, 128], "WS": [0, 1]}},
    n_tokens=n_tokens, int32_reads=lambda s: s[0] * 4,  # seq_lens
    shape_dims=("B", "H", "L", "P", "R"), exact_dims=("H", "P"), cheap=(1, 16, 17, 16, 1),
    search=SEARCH, sweep=SWEEP, heldout=HELDOUT, tiny=TINY, make_inputs=make_inputs,
    reference=reference, torch_default=torch_default, shape_of=shape_of)

# the memory-bound split-KV schedule fit to the batch and its lengths (also mla_decode_mtp's)
FAMILY.variants["fitted"] = Variant("fitted", Path(__file__).parent / "fitted.py",
                                    mla.tile_dims(**mla.FITTED_DIMS),
                                    mla.rows_tile_valid(lambda s: s[1]))

# library variants (kernelsearch.families.library): offered where the library imports
from kernelsearch.families import library as _library  # noqa: E402

FLASHMLA_HEADS = (16, 32, 64, 128)  # the head counts FlashMLA's SM90 dense decode takes


def _flashmla_fit(s):
    return (s[0], s[1] if s[1] in FLASHMLA_HEADS else 128, s[2], 64) + tuple(s[4:])


FAMILY.variants["flashmla"] = _library.variant(
    "flashmla", Path(__file__).parent, "flash_mla",
    fits=lambda s: s[3] == 64 and s[1] in FLASHMLA_HEADS, dtypes=("bfloat16",),
    fit=_flashmla_fit)

# Gluon variants (kernelsearch.families.gluon): compiled for sm_90 only, offered where that holds
from kernelsearch.families import gluon as _gluon  # noqa: E402

GLUON_DIMS = {"BLOCK_N": [32, 64], "GRID": [132, 264, 528, 1056], "STAGES": [2, 3, 4],
              "PIPE": [0, 1]}


def gluon_valid(cfg: dict, shape) -> bool:
    """64 heads a program on two warpgroups (any H: masked rows), q and the STAGES-deep ring of
    [BLOCK_N, 576] tiles in the 227 KiB of shared memory (what the compiled kernels report)."""
    return (cfg["STAGES"] * cfg["BLOCK_N"] + 64) * mla.D_QK * 2 <= 227 * 1024


FAMILY.variants["gluon_wgmma"] = _gluon.variant("gluon_wgmma", Path(__file__).parent,
                                                GLUON_DIMS, gluon_valid)
# the warp-specialized ping-pong kernel: its tile is fixed (64 heads x 64 tokens, two stages)
FAMILY.variants["gluon_pingpong"] = _gluon.variant(
    "gluon_pingpong", Path(__file__).parent, {"GRID": [132, 264, 528, 1056], "STAGES": [2]},
    lambda cfg, shape: True)
