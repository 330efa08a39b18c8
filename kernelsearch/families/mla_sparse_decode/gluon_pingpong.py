"""Sparse MLA decode in Gluon (Hopper): mla_decode's gluon_pingpong over the selected rows.
FOLD=1: the loader warps map each tile's selected positions to physical cache rows through the
block table themselves (skipped: -1, at or past the length) and the warpgroups mask by position:
one launch fewer and no rows buffer. FOLD=0 (the default, so that an entry measured before FOLD
existed runs as measured): a first small kernel writes the rows for the main one. Neither wins
everywhere on the H200 (-4% to +5% at the same config), so FOLD is searched like the others.
LOADERS loader warps gather each [64, 576] tile of those rows by cp.async (skipped slots
zero-filled, so nothing unread reaches P V) into a two-stage ring and signal an mbarrier when
their copies land; they read (and map) the next tile's rows before waiting for a free stage, so
those loads' latency is off the path to the copies (one warp reading them per 16-row step was
the kernel's bottleneck: 1.3-1.5x slower). Two warpgroups take the tiles in turn as in the dense
kernel: the owner's S = q K^T (the tile's slots read before S is issued), softmax and P (over
the rope block), then both P V on their half of V, P from registers or, P_SMEM, straight from
shared memory as the wgmma's A operand (fewer registers; faster at the largest batches). A tile
with no selected row keeps the running max at -inf and adds nothing. Split over the top-k with
the LSE merge. `forward_rows` takes physical rows directly (FlashMLA's indices). A position
inside the length whose block-table entry points outside the cache reads nothing (its key is
zero); the caller's block table is otherwise trusted, as by every kernel here.
Triton 3.6's Gluon names (kernelsearch.families.gluon)."""
import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier,
                                                              warpgroup_mma, warpgroup_mma_wait)

TILE = gl.constexpr(64)  # selected rows a tile, heads a program, columns a block
T = 64  # TILE for host code (a plain int)
NBLK = gl.constexpr(9)  # 576 / 64 column blocks: 0-7 the latent (V), 8 the rope part


@gluon.jit
def _rows_kernel(BT, SL, IDX, R, topk, cap, sbt, sib, PAGE: gl.constexpr, BLOCK: gl.constexpr,
                 num_warps: gl.constexpr):
    L1: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])
    b = gl.program_id(0)
    n = gl.program_id(1) * BLOCK + gl.arange(0, BLOCK, layout=L1)
    seqlen = gl.minimum(gl.load(SL + b), cap)
    pos = gl.load(IDX + b.to(gl.int64) * sib + n, mask=n < topk, other=-1)
    ok = (pos >= 0) & (pos < seqlen)
    pos = gl.where(ok, pos, 0)
    blk = gl.load(BT + b.to(gl.int64) * sbt + pos // PAGE, mask=ok, other=0)
    gl.store(R + b.to(gl.int64) * topk + n, gl.where(ok, blk * PAGE + pos % PAGE, -1),
             mask=n < topk)


@gluon.jit
def _tile_rows(ib, bt, n, end, seqlen, PAGE: gl.constexpr, POS: gl.constexpr):
    """Physical rows of slots n (-1: skipped, or past the split). POS: ib holds positions,
    mapped through the block table bt (only where the position is selected); else rows."""
    v = gl.load(ib + n, mask=n < end, other=-1)
    if POS:
        ok = (v >= 0) & (v < seqlen)
        p = gl.where(ok, v, 0)
        blk = gl.load(bt + p // PAGE, mask=ok, other=0)
        v = gl.where(ok, blk * PAGE + p % PAGE, -1)
    return v


@gluon.jit
def _consume(W: gl.constexpr, q_s, kv_s, m_s, a_s, l_s, ready, free, pready, fin,
             O, Op, Lp, b, hb, H, s_id, n_splits, start, end, n_tiles, qk_scale, sob, soh,
             rb, nrows, seqlen, STAGES: gl.constexpr, ONE: gl.constexpr, P_SMEM: gl.constexpr,
             POS: gl.constexpr):
    S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, 64, 16])
    P_L: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=S_L, k_width=2)
    R_L: gl.constexpr = gl.SliceLayout(1, S_L)
    C_L: gl.constexpr = gl.SliceLayout(0, S_L)
    dt = kv_s.dtype
    m_i = gl.full([TILE], -float("inf"), gl.float32, layout=R_L)
    l_i = gl.zeros([TILE], gl.float32, layout=R_L)
    zero = gl.zeros([TILE, TILE], gl.float32, layout=S_L)
    acc0 = zero
    acc1 = zero
    acc2 = zero
    acc3 = zero
    for t in range(n_tiles):
        s = t % STAGES
        ph = (t // STAGES) & 1
        base = s * NBLK
        mbarrier.wait(ready.index(s), ph)
        fence_async_shared()  # the gathered rows (cp.async) before wgmma reads them
        if t % 2 == W:
            n0 = start + t * TILE
            n = n0 + gl.arange(0, TILE, layout=C_L)
            # the slots' validity read before S: its latency hides under S. By position where
            # the loaders map them (no block-table read on this path), else by row
            r = gl.load(rb + n, mask=n < end, other=-1)
            if POS:
                sel = (r >= 0) & (r < seqlen)
            else:
                sel = (r >= 0) & (r < nrows)
            sc = warpgroup_mma(q_s.index(0), kv_s.index(base).permute((1, 0)), zero,
                               use_acc=False, is_async=True)
            for c in gl.static_range(1, NBLK):
                sc = warpgroup_mma(q_s.index(c), kv_s.index(base + c).permute((1, 0)), sc,
                                   is_async=True)
            sc = warpgroup_mma_wait(num_outstanding=0, deps=(sc,))
            sc = gl.where(sel[None, :], sc * qk_scale, -float("inf"))
            m_new = gl.maximum(m_i, gl.max(sc, axis=1))
            # a tile with no selected row keeps m = -inf: exponentials of 0, not NaN
            m_use = gl.where(m_new > -float("inf"), m_new, 0.0)
            alpha = gl.exp2(m_i - m_use)
            p = gl.exp2(sc - m_use[:, None])
            l_i = l_i * alpha + gl.sum(p, axis=1)
            m_i = m_new
            pb = p.to(dt)
            kv_s.index(base + NBLK - 1).store(pb)
            m_s.index(s).store(m_new)
            a_s.index(s).store(alpha)
            fence_async_shared()
            gl.thread_barrier()  # every warp of this warpgroup has written before the signal
            mbarrier.arrive(pready.index(s), count=1)
            if not P_SMEM:
                pa = gl.convert_layout(pb, P_L)
        else:
            mbarrier.wait(pready.index(s), ph)
            alpha = a_s.index(s).load(R_L)
            m_i = m_s.index(s).load(R_L)
            l_i = l_i * alpha
            if not P_SMEM:
                pa = kv_s.index(base + NBLK - 1).load(P_L)
        if P_SMEM:
            pa = kv_s.index(base + NBLK - 1)  # P straight from shared memory (the A operand)
        acc0 = warpgroup_mma(pa, kv_s.index(base + 4 * W), acc0 * alpha[:, None], is_async=True)
        acc1 = warpgroup_mma(pa, kv_s.index(base + 4 * W + 1), acc1 * alpha[:, None],
                             is_async=True)
        acc2 = warpgroup_mma(pa, kv_s.index(base + 4 * W + 2), acc2 * alpha[:, None],
                             is_async=True)
        acc3 = warpgroup_mma(pa, kv_s.index(base + 4 * W + 3), acc3 * alpha[:, None],
                             is_async=True)
        acc0, acc1, acc2, acc3 = warpgroup_mma_wait(num_outstanding=0,
                                                    deps=(acc0, acc1, acc2, acc3))
        gl.thread_barrier()
        mbarrier.arrive(free.index(s), count=1)

    # l: each warpgroup summed its own tiles' rows (rescaled by every tile's factor)
    l_s.index(W).store(l_i)
    gl.thread_barrier()
    mbarrier.arrive(fin, count=1)
    mbarrier.wait(fin, 0)
    l_t = l_s.index(0).load(R_L) + l_s.index(1).load(R_L)
    safe = gl.where(l_t > 0, l_t, 1.0)
    h = hb * TILE + gl.arange(0, TILE, layout=R_L)
    hmask = (h < H)[:, None]
    d = W * 256 + gl.arange(0, TILE, layout=C_L)
    if ONE:
        orow = O + b.to(gl.int64) * sob + h[:, None] * soh + d[None, :]
        gl.store(orow, (acc0 / safe[:, None]).to(O.dtype.element_ty), mask=hmask)
        gl.store(orow + 64, (acc1 / safe[:, None]).to(O.dtype.element_ty), mask=hmask)
        gl.store(orow + 128, (acc2 / safe[:, None]).to(O.dtype.element_ty), mask=hmask)
        gl.store(orow + 192, (acc3 / safe[:, None]).to(O.dtype.element_ty), mask=hmask)
    else:
        prow = (b.to(gl.int64) * H + h) * n_splits + s_id
        if W == 0:
            gl.store(Lp + prow, gl.where(l_t > 0, m_i + gl.log2(safe), -float("inf")),
                     mask=h < H)
        orow = Op + prow[:, None] * 512 + d[None, :]
        gl.store(orow, acc0 / safe[:, None], mask=hmask)
        gl.store(orow + 64, acc1 / safe[:, None], mask=hmask)
        gl.store(orow + 128, acc2 / safe[:, None], mask=hmask)
        gl.store(orow + 192, acc3 / safe[:, None], mask=hmask)


@gluon.jit
def _default(q_s, kv_s, m_s, a_s, l_s, ready, free, pready, fin, O, Op, Lp, b, hb, H,
             s_id, n_splits, start, end, n_tiles, qk_scale, sob, soh, rb, nrows, bt, seqlen,
             STAGES: gl.constexpr, ONE: gl.constexpr, LOADERS: gl.constexpr,
             P_SMEM: gl.constexpr, PAGE: gl.constexpr, POS: gl.constexpr):
    _consume(0, q_s, kv_s, m_s, a_s, l_s, ready, free, pready, fin, O, Op, Lp, b, hb, H,
             s_id, n_splits, start, end, n_tiles, qk_scale, sob, soh, rb, nrows, seqlen, STAGES,
             ONE, P_SMEM, POS)


@gluon.jit
def _second(KV, q_s, kv_s, m_s, a_s, l_s, ready, free, pready, fin, O, Op, Lp, b, hb, H,
            s_id, n_splits, start, end, n_tiles, qk_scale, sob, soh, rb, nrows, bt, seqlen,
            STAGES: gl.constexpr, ONE: gl.constexpr, LOADERS: gl.constexpr,
            P_SMEM: gl.constexpr, PAGE: gl.constexpr, POS: gl.constexpr):
    _consume(1, q_s, kv_s, m_s, a_s, l_s, ready, free, pready, fin, O, Op, Lp, b, hb, H,
             s_id, n_splits, start, end, n_tiles, qk_scale, sob, soh, rb, nrows, seqlen, STAGES,
             ONE, P_SMEM, POS)


@gluon.jit
def _loader(KV, q_s, kv_s, m_s, a_s, l_s, ready, free, pready, fin, O, Op, Lp, b, hb, H,
            s_id, n_splits, start, end, n_tiles, qk_scale, sob, soh, rb, nrows, bt, seqlen,
            STAGES: gl.constexpr, ONE: gl.constexpr, LOADERS: gl.constexpr,
            P_SMEM: gl.constexpr, PAGE: gl.constexpr, POS: gl.constexpr):
    LG: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [LOADERS, 1], [1, 0])  # LOADERS warps
    cols = gl.arange(0, TILE, layout=gl.SliceLayout(0, LG))
    # the whole tile in one step (TILE / (4 LOADERS) rows a thread), its rows read (POS: and
    # mapped through the block table) one tile ahead: those loads' latency is off the path from
    # `free` to the copies
    nr = gl.arange(0, TILE, layout=gl.SliceLayout(1, LG))
    row = _tile_rows(rb, bt, start + nr, end, seqlen, PAGE, POS)
    for t in range(n_tiles):
        s = t % STAGES
        ph = (t // STAGES) & 1
        nx = start + (t + 1) * TILE + nr
        row_nx = _tile_rows(rb, bt, nx, end, seqlen, PAGE, POS)
        mbarrier.wait(free.index(s), ph ^ 1)  # both warpgroups are done with this stage
        ok = (row >= 0) & (row < nrows)
        ptr = KV + gl.where(ok, row, 0).to(gl.int64)[:, None] * 576 + cols[None, :]
        for c in gl.static_range(NBLK):
            async_copy.async_copy_global_to_shared(kv_s.index(s * NBLK + c), ptr + c * TILE,
                                                   mask=ok[:, None])
        async_copy.mbarrier_arrive(ready.index(s), increment_count=False)
        row = row_nx


@gluon.jit
def _sparse_pingpong(Q, KV, RW, BT, SL, O, Op, Lp, H, topk, n_splits, split_len, qk_scale,
                     nrows, cap, sqb, sqh, srb, sbt, sob, soh, PAGE: gl.constexpr,
                     POS: gl.constexpr, STAGES: gl.constexpr, ONE: gl.constexpr,
                     LOADERS: gl.constexpr, P_SMEM: gl.constexpr, num_warps: gl.constexpr):
    """RW: positions [B, topk] (POS, mapped through BT with lengths SL capped at cap) or
    physical rows (BT, SL unused)."""
    hb = gl.program_id(0)
    s_id = gl.program_id(1)
    b = gl.program_id(2)
    start = s_id * split_len
    end = gl.minimum(start + split_len, topk)
    n_tiles = gl.maximum((end - start + TILE - 1) // TILE, 0)
    B_S: gl.constexpr = gl.NVMMASharedLayout.get_default_for([TILE, TILE], gl.bfloat16)
    V_S: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    q_s = gl.allocate_shared_memory(KV.dtype.element_ty, [NBLK, TILE, TILE], B_S)
    kv_s = gl.allocate_shared_memory(KV.dtype.element_ty, [STAGES * NBLK, TILE, TILE], B_S)
    m_s = gl.allocate_shared_memory(gl.float32, [STAGES, TILE], V_S)
    a_s = gl.allocate_shared_memory(gl.float32, [STAGES, TILE], V_S)
    l_s = gl.allocate_shared_memory(gl.float32, [2, TILE], V_S)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    pready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    fin = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=32 * LOADERS)  # every loader thread
        mbarrier.init(free.index(i), count=2)
        mbarrier.init(pready.index(i), count=1)
    mbarrier.init(fin, count=2)
    QL: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
    hq = hb * TILE + gl.arange(0, TILE, layout=gl.SliceLayout(1, QL))
    cq = gl.arange(0, TILE, layout=gl.SliceLayout(0, QL))
    qrow = Q + b.to(gl.int64) * sqb + hq[:, None] * sqh + cq[None, :]
    for c in gl.static_range(NBLK):
        q_s.index(c).store(gl.load(qrow + c * TILE, mask=(hq < H)[:, None], other=0.0))
    fence_async_shared()
    rb = RW + b.to(gl.int64) * srb
    bt = BT + b.to(gl.int64) * sbt
    if POS:
        seqlen = gl.minimum(gl.load(SL + b), cap)
    else:
        seqlen = cap
    gl.warp_specialize([
        (_default, (q_s, kv_s, m_s, a_s, l_s, ready, free, pready, fin, O, Op, Lp, b, hb, H,
                    s_id, n_splits, start, end, n_tiles, qk_scale, sob, soh, rb, nrows, bt,
                    seqlen, STAGES, ONE, LOADERS, P_SMEM, PAGE, POS)),
        (_second, (KV, q_s, kv_s, m_s, a_s, l_s, ready, free, pready, fin, O, Op, Lp, b, hb, H,
                   s_id, n_splits, start, end, n_tiles, qk_scale, sob, soh, rb, nrows, bt,
                   seqlen, STAGES, ONE, LOADERS, P_SMEM, PAGE, POS)),
        (_loader, (KV, q_s, kv_s, m_s, a_s, l_s, ready, free, pready, fin, O, Op, Lp, b, hb, H,
                   s_id, n_splits, start, end, n_tiles, qk_scale, sob, soh, rb, nrows, bt,
                   seqlen, STAGES, ONE, LOADERS, P_SMEM, PAGE, POS)),
    ], [4, LOADERS], [232, 40])


@gluon.jit
def _sparse_pingpong_merge(Op, Lp, O, H, n_splits, sob, soh, SPAD: gl.constexpr,
                        num_warps: gl.constexpr):
    L1: gl.constexpr = gl.BlockedLayout([4], [32], [num_warps], [0])
    bh = gl.program_id(0)
    b = bh // H
    h = bh % H
    base = bh.to(gl.int64) * n_splits
    sp = gl.arange(0, SPAD, layout=L1)
    lse = gl.load(Lp + base + sp, mask=sp < n_splits, other=-float("inf"))
    mx = gl.max(lse, axis=0)
    w = gl.where(lse > -float("inf"), gl.exp2(lse - mx), 0.0)
    w = w / gl.maximum(gl.sum(w, axis=0), 1e-30)
    d = gl.arange(0, 512, layout=L1)
    acc = gl.zeros([512], gl.float32, layout=L1)
    for i in range(0, n_splits):
        wi = gl.sum(gl.where(sp == i, w, 0.0), axis=0)
        acc += wi * gl.load(Op + (base + i) * 512 + d)
    gl.store(O + b.to(gl.int64) * sob + h * soh + d, acc.to(O.dtype.element_ty))


def forward_rows(q, kv_cache, rows, scale, *, GRID: int = 264, STAGES: int = 2,
                 REGS: int = 168, LOADERS: int = 2, P_SMEM: int = 0):
    """Over physical cache rows [B, topk] int32 (-1 or outside the cache: unused)."""
    return _launch(q, kv_cache, rows, None, None, scale, GRID, STAGES, REGS, LOADERS, P_SMEM)


def _launch(q, kv_cache, ix, block_table, seq_lens, scale, GRID, STAGES, REGS, LOADERS,
            P_SMEM):
    """ix: positions (with block_table and seq_lens) or rows (both None)."""
    B, H = q.shape[0], q.shape[1]
    topk = ix.shape[1]
    pos = block_table is not None
    page = kv_cache.shape[1]
    hb = (H + T - 1) // T
    tiles = (topk + T - 1) // T
    want = max(1, min(GRID // (B * hb), tiles))
    per = (tiles + want - 1) // want
    n_splits = (tiles + per - 1) // per
    out = torch.empty((B, H, 512), dtype=q.dtype, device=q.device)
    one = n_splits == 1
    nrow = 1 if one else B * H * n_splits
    op = torch.empty((nrow * 512,), dtype=torch.float32, device=q.device)
    lp = torch.empty((nrow,), dtype=torch.float32, device=q.device)
    bt, sl = (block_table, seq_lens) if pos else (ix, ix)  # unread without positions
    _sparse_pingpong[(hb, n_splits, B)](
        q, kv_cache, ix, bt, sl, out, op, lp, H, topk, n_splits, per * T,
        scale * 1.4426950408889634, kv_cache.shape[0] * page,
        bt.shape[1] * page if pos else 0, q.stride(0), q.stride(1), ix.stride(0),
        bt.stride(0) if pos else 0, out.stride(0), out.stride(1),
        PAGE=page if pos else 1, POS=pos, STAGES=STAGES, ONE=one, LOADERS=LOADERS,
        P_SMEM=bool(P_SMEM), num_warps=4, maxnreg=REGS)
    if not one:
        spad = 1 << (n_splits - 1).bit_length()
        _sparse_pingpong_merge[(B * H,)](op, lp, out, H, n_splits, out.stride(0),
                                         out.stride(1), SPAD=max(spad, 128), num_warps=4)
    return out


def forward(q, kv_cache, block_table, seq_lens, indices, scale, *, GRID: int = 264,
            STAGES: int = 2, REGS: int = 168, LOADERS: int = 2, P_SMEM: int = 0,
            FOLD: int = 0):
    if FOLD:
        return _launch(q, kv_cache, indices, block_table, seq_lens, scale, GRID, STAGES, REGS,
                       LOADERS, P_SMEM)
    page = kv_cache.shape[1]
    B, topk = indices.shape[0], indices.shape[1]
    rows = torch.empty((B, topk), dtype=torch.int32, device=q.device)
    _rows_kernel[(B, (topk + 255) // 256)](block_table, seq_lens, indices, rows, topk,
                                           block_table.shape[1] * page, block_table.stride(0),
                                           indices.stride(0), PAGE=page, BLOCK=256, num_warps=4)
    return forward_rows(q, kv_cache, rows, scale, GRID=GRID, STAGES=STAGES, REGS=REGS,
                        LOADERS=LOADERS, P_SMEM=P_SMEM)
