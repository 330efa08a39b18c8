"""MLA decode in Gluon (Hopper): gluon_pingpong's warp-specialized ping-pong with each
warpgroup's next S = q K^T issued *ahead*, so the tensor cores have work while the other
warpgroup runs its softmax (in gluon_pingpong they idle then: its loop without cache loads tops
out at 70-79% of the floor, which that idle time explains).

Three partitions per program of 64 query heads x one split of the context:
- a loader warp brings q (once, by the default warps) and each [64, 576] latent tile (one
  64-token piece of a page) by TMA as nine [64, 64] column blocks, each completing on its own
  mbarrier, so an S can start on block 0 while block 8 is in flight;
- warpgroup W owns the tiles t with t % 2 == W: its S(t), the softmax against the running max the
  other one left in shared memory, and P (written over the tile's rope block, which nobody reads
  after S). Each warpgroup computes O += P V on its half of V's 512 columns for every tile.

A warpgroup's loop over its own tiles j: (1) take the other's tile j-1 (wait its P, rescale,
issue P V), (2) wait for S(j), which was issued one round earlier, softmax, publish P(j),
(3) issue its own P V, (4) issue S(j+2). While the other warpgroup is in its softmax of j+1, this
one's S(j+2) and P V run. A stage's blocks are released by those who read them last: blocks 0-3
(V's left half) by warpgroup 0 after its P V, 4-7 by warpgroup 1, block 8 (rope, then P) by the
tile's other warpgroup once it has read P; so a block reloads as soon as it is free.

Rows past a sequence's end in its last tile may hold anything (NaN in FlashMLA's tests): their
scores are masked and the owner zeroes their V rows before any P V. Needs a page of a multiple
of 64 tokens, 16-byte aligned (the family offers it only there; an unaligned view is copied).
Chunks merged by log-sum-exp as splitkv. Triton 3.6's Gluon names (kernelsearch.families.gluon)."""
import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma,
                                                              warpgroup_mma, warpgroup_mma_wait)

TILE = gl.constexpr(64)  # tokens a tile, heads a program, columns a TMA block
T = 64  # TILE for host code (a plain int)
NBLK = gl.constexpr(9)  # 576 / 64 column blocks: 0-7 the latent (V), 8 the rope part


@gluon.jit
def _s(q_s, kv_s, ready, t, STAGES: gl.constexpr, zero):
    """S = q K^T for tile t, waited for. No wgmma stays in flight across a branch or an
    mbarrier wait: ptxas then serializes every wgmma of the kernel (checked in the SASS: a
    WARPGROUP.DEPBAR after each HGMMA). The overlap this kernel is for is between the two
    warpgroups, so nothing is lost: this one has nothing else to do meanwhile."""
    s = t % STAGES
    base = s * NBLK
    ph = (t // STAGES) & 1
    for c in gl.static_range(NBLK):
        mbarrier.wait(ready.index(base + c), ph)
    sc = warpgroup_mma(q_s.index(0), kv_s.index(base).permute((1, 0)), zero, use_acc=False,
                       is_async=True)
    for c in gl.static_range(1, NBLK):
        sc = warpgroup_mma(q_s.index(c), kv_s.index(base + c).permute((1, 0)), sc, is_async=True)
    return warpgroup_mma_wait(num_outstanding=0, deps=(sc,))


@gluon.jit
def _pv(W: gl.constexpr, kv_s, freeh, t, pa, alpha, acc0, acc1, acc2, acc3,
        STAGES: gl.constexpr):
    """O_half = O_half * alpha + P V_half on this warpgroup's four V blocks of tile t, waited
    for; then this half of tile t is released to the loader."""
    base = (t % STAGES) * NBLK
    acc0 = warpgroup_mma(pa, kv_s.index(base + 4 * W), acc0 * alpha[:, None], is_async=True)
    acc1 = warpgroup_mma(pa, kv_s.index(base + 4 * W + 1), acc1 * alpha[:, None], is_async=True)
    acc2 = warpgroup_mma(pa, kv_s.index(base + 4 * W + 2), acc2 * alpha[:, None], is_async=True)
    acc3 = warpgroup_mma(pa, kv_s.index(base + 4 * W + 3), acc3 * alpha[:, None], is_async=True)
    acc0, acc1, acc2, acc3 = warpgroup_mma_wait(num_outstanding=0, deps=(acc0, acc1, acc2, acc3))
    gl.thread_barrier()
    mbarrier.arrive(freeh.index(t % STAGES), count=1)
    return acc0, acc1, acc2, acc3


@gluon.jit
def _take(W: gl.constexpr, kv_s, m_s, a_s, pready, free8, freeh, t, l_i, acc0, acc1, acc2,
          acc3, STAGES: gl.constexpr, R_L: gl.constexpr, P_L: gl.constexpr):
    """The other warpgroup's tile t: its P (block 8 released once read), max and rescale
    factor, and the P V on this half."""
    s = t % STAGES
    mbarrier.wait(pready.index(s), (t // STAGES) & 1)
    alpha = a_s.index(s).load(R_L)
    m_i = m_s.index(s).load(R_L)
    pa = kv_s.index(s * NBLK + NBLK - 1).load(P_L)
    gl.thread_barrier()  # every warp has read P before block 8 is released
    mbarrier.arrive(free8.index(s), count=1)
    acc0, acc1, acc2, acc3 = _pv(W, kv_s, freeh, t, pa, alpha, acc0, acc1, acc2, acc3, STAGES)
    return m_i, l_i * alpha, acc0, acc1, acc2, acc3


@gluon.jit
def _consume(W: gl.constexpr, q_s, kv_s, m_s, a_s, l_s, ready, freeh, free8, pready, fin,
             O, Op, Lp, b, hb, H, s_id, n_splits, start, end, n_tiles, qk_scale, sob, soh,
             STAGES: gl.constexpr, ONE: gl.constexpr):
    S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, 64, 16])
    P_L: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=S_L, k_width=2)
    R_L: gl.constexpr = gl.SliceLayout(1, S_L)
    C_L: gl.constexpr = gl.SliceLayout(0, S_L)
    Z_L: gl.constexpr = gl.BlockedLayout([1, 8], [8, 4], [4, 1], [1, 0])
    dt = kv_s.dtype
    m_i = gl.full([TILE], -float("inf"), gl.float32, layout=R_L)
    l_i = gl.zeros([TILE], gl.float32, layout=R_L)
    zero = gl.zeros([TILE, TILE], gl.float32, layout=S_L)
    acc0 = zero
    acc1 = zero
    acc2 = zero
    acc3 = zero
    sc = zero
    if W < n_tiles:
        sc = _s(q_s, kv_s, ready, W, STAGES, zero)
    for j in range(W, n_tiles, 2):
        s = j % STAGES
        base = s * NBLK
        # S(j) ran a round ago, while the other warpgroup did its softmax
        if j >= 1:
            m_i, l_i, acc0, acc1, acc2, acc3 = _take(W, kv_s, m_s, a_s, pready, free8, freeh,
                                                     j - 1, l_i, acc0, acc1, acc2, acc3,
                                                     STAGES, R_L, P_L)
        n0 = start + j * TILE
        n = n0 + gl.arange(0, TILE, layout=C_L)
        sc = gl.where((n < end)[None, :], sc * qk_scale, -float("inf"))
        m_new = gl.maximum(m_i, gl.max(sc, axis=1))
        alpha = gl.exp2(m_i - m_new)
        p = gl.exp2(sc - m_new[:, None])
        l_i = l_i * alpha + gl.sum(p, axis=1)
        m_i = m_new
        if n0 + TILE > end:  # the last tile: zero V's rows past the end (may be NaN)
            zr = n0 + gl.arange(0, TILE, layout=gl.SliceLayout(1, Z_L))
            for c in gl.static_range(NBLK - 1):
                blk = kv_s.index(base + c)
                v = blk.load(Z_L)
                blk.store(gl.where((zr < end)[:, None], v, gl.zeros_like(v)))
        pb = p.to(dt)
        kv_s.index(base + NBLK - 1).store(pb)
        m_s.index(s).store(m_new)
        a_s.index(s).store(alpha)
        fence_async_shared()
        gl.thread_barrier()  # every warp of this warpgroup has written before the signal
        mbarrier.arrive(pready.index(s), count=1)
        pa = gl.convert_layout(pb, P_L)
        acc0, acc1, acc2, acc3 = _pv(W, kv_s, freeh, j, pa, alpha, acc0, acc1, acc2, acc3,
                                     STAGES)
        if j + 2 < n_tiles:
            # tile j + 2 reuses tile j's stage (this half released above): S(j + 2) runs while
            # the other warpgroup takes tile j and does its softmax of j + 1
            sc = _s(q_s, kv_s, ready, j + 2, STAGES, zero)
    # the other warpgroup's last tile, when it owns the last one
    last = n_tiles - 1
    if last >= 0:
        if last % 2 != W:
            m_i, l_i, acc0, acc1, acc2, acc3 = _take(W, kv_s, m_s, a_s, pready, free8, freeh,
                                                     last, l_i, acc0, acc1, acc2, acc3, STAGES,
                                                     R_L, P_L)

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
def _default(q_s, kv_s, m_s, a_s, l_s, ready, freeL, freeR, free8, pready, fin, O, Op, Lp, b,
             hb, H, s_id, n_splits, start, end, n_tiles, qk_scale, sob, soh,
             STAGES: gl.constexpr, ONE: gl.constexpr):
    _consume(0, q_s, kv_s, m_s, a_s, l_s, ready, freeL, free8, pready, fin, O, Op, Lp, b, hb, H,
             s_id, n_splits, start, end, n_tiles, qk_scale, sob, soh, STAGES, ONE)


@gluon.jit
def _second(kv_desc, bt, q_s, kv_s, m_s, a_s, l_s, ready, freeL, freeR, free8, pready, fin, O,
            Op, Lp, b, hb, H, s_id, n_splits, start, end, n_tiles, qk_scale, sob, soh,
            PAGE: gl.constexpr, STAGES: gl.constexpr, ONE: gl.constexpr,
            PROBE: gl.constexpr):
    _consume(1, q_s, kv_s, m_s, a_s, l_s, ready, freeR, free8, pready, fin, O, Op, Lp, b, hb, H,
             s_id, n_splits, start, end, n_tiles, qk_scale, sob, soh, STAGES, ONE)


@gluon.jit
def _loader(kv_desc, bt, q_s, kv_s, m_s, a_s, l_s, ready, freeL, freeR, free8, pready, fin, O,
            Op, Lp, b, hb, H, s_id, n_splits, start, end, n_tiles, qk_scale, sob, soh,
            PAGE: gl.constexpr, STAGES: gl.constexpr, ONE: gl.constexpr,
            PROBE: gl.constexpr):
    nbytes: gl.constexpr = TILE * TILE * 2
    for t in range(n_tiles):
        s = t % STAGES
        fph = ((t // STAGES) & 1) ^ 1
        n0 = start + t * TILE
        blk = gl.load(bt + n0 // PAGE)
        row = blk * PAGE + n0 % PAGE
        # each block group reloads once its last reader released it (see the module text)
        for g in gl.static_range(3):
            if g == 0:
                mbarrier.wait(freeL.index(s), fph)
            elif g == 1:
                mbarrier.wait(freeR.index(s), fph)
            else:
                mbarrier.wait(free8.index(s), fph)
            fence_async_shared()  # their generic reads/writes of it before the TMA writes
            for c in gl.static_range(4 * g, 4 * g + 4 - 3 * (g // 2)):
                if PROBE:  # a ceiling probe: no cache reads (the output is wrong; timing only)
                    mbarrier.arrive(ready.index(s * NBLK + c), count=1)
                else:
                    mbarrier.expect(ready.index(s * NBLK + c), nbytes)
                    tma.async_copy_global_to_shared(kv_desc, [row, c * TILE],
                                                    ready.index(s * NBLK + c),
                                                    kv_s.index(s * NBLK + c))


@gluon.jit
def _mla_ahead(Q, kv_desc, BT, SL, O, Op, Lp, H, n_splits, split_len, qk_scale, sqb, sqh,
               sbt, sob, soh, PAGE: gl.constexpr, STAGES: gl.constexpr, ONE: gl.constexpr,
               PROBE: gl.constexpr, num_warps: gl.constexpr):
    hb = gl.program_id(0)
    s_id = gl.program_id(1)
    b = gl.program_id(2)
    seqlen = gl.load(SL + b)
    start = s_id * split_len
    end = gl.minimum(start + split_len, seqlen)
    n_tiles = gl.maximum((end - start + TILE - 1) // TILE, 0)
    B_S: gl.constexpr = gl.NVMMASharedLayout.get_default_for([TILE, TILE], gl.bfloat16)
    V_S: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    q_s = gl.allocate_shared_memory(kv_desc.dtype, [NBLK, TILE, TILE], B_S)
    kv_s = gl.allocate_shared_memory(kv_desc.dtype, [STAGES * NBLK, TILE, TILE], B_S)
    m_s = gl.allocate_shared_memory(gl.float32, [STAGES, TILE], V_S)
    a_s = gl.allocate_shared_memory(gl.float32, [STAGES, TILE], V_S)
    l_s = gl.allocate_shared_memory(gl.float32, [2, TILE], V_S)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES * NBLK, 1], mbarrier.MBarrierLayout())
    freeL = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    freeR = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    free8 = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    pready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    fin = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES * NBLK):
        mbarrier.init(ready.index(i), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(freeL.index(i), count=1)
        mbarrier.init(freeR.index(i), count=1)
        mbarrier.init(free8.index(i), count=1)
        mbarrier.init(pready.index(i), count=1)
    mbarrier.init(fin, count=2)
    # q once into shared memory by these (the default partition's) warps, before the partitions
    # start: any q strides and alignment
    QL: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
    hq = hb * TILE + gl.arange(0, TILE, layout=gl.SliceLayout(1, QL))
    cq = gl.arange(0, TILE, layout=gl.SliceLayout(0, QL))
    qrow = Q + b.to(gl.int64) * sqb + hq[:, None] * sqh + cq[None, :]
    for c in gl.static_range(NBLK):
        q_s.index(c).store(gl.load(qrow + c * TILE, mask=(hq < H)[:, None], other=0.0))
    fence_async_shared()
    bt = BT + b.to(gl.int64) * sbt
    gl.warp_specialize([
        (_default, (q_s, kv_s, m_s, a_s, l_s, ready, freeL, freeR, free8, pready, fin, O, Op,
                    Lp, b, hb, H, s_id, n_splits, start, end, n_tiles, qk_scale, sob, soh,
                    STAGES, ONE)),
        (_second, (kv_desc, bt, q_s, kv_s, m_s, a_s, l_s, ready, freeL, freeR, free8, pready,
                   fin, O, Op, Lp, b, hb, H, s_id, n_splits, start, end, n_tiles, qk_scale,
                   sob, soh, PAGE, STAGES, ONE, PROBE)),
        (_loader, (kv_desc, bt, q_s, kv_s, m_s, a_s, l_s, ready, freeL, freeR, free8, pready,
                   fin, O, Op, Lp, b, hb, H, s_id, n_splits, start, end, n_tiles, qk_scale,
                   sob, soh, PAGE, STAGES, ONE, PROBE)),
    ], [4, 1], [232, 40])


@gluon.jit
def _mla_ahead_merge(Op, Lp, O, H, n_splits, sob, soh, SPAD: gl.constexpr,
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


def forward(q, kv_cache, block_table, seq_lens, scale, *, GRID: int = 264, STAGES: int = 2,
            REGS: int = 168, PROBE: int = 0):
    """out [B, H, 512]; any H (masked rows past it); pages of a multiple of 64 tokens. PROBE=1:
    a ceiling probe (the loader copies nothing; the output is wrong)."""
    B, H = q.shape[0], q.shape[1]
    page = kv_cache.shape[1]
    if page % T:
        raise ValueError(f"gluon_ahead needs pages of a multiple of {T} tokens, not {page}")
    if kv_cache.data_ptr() % 16:  # TMA reads 16-byte aligned rows (an offset view)
        kv_cache = kv_cache.clone()
    cap = block_table.shape[1] * page
    hb = (H + T - 1) // T
    tiles = (cap + T - 1) // T
    # one program an SM (223 KB of shared memory): at most GRID programs, so GRID = k x 132
    # fills k waves with no nearly empty last one
    want = max(1, min(GRID // (B * hb), tiles))
    per = (tiles + want - 1) // want
    n_splits = (tiles + per - 1) // per
    out = torch.empty((B, H, 512), dtype=q.dtype, device=q.device)
    one = n_splits == 1
    rows = 1 if one else B * H * n_splits
    op = torch.empty((rows * 512,), dtype=torch.float32, device=q.device)
    lp = torch.empty((rows,), dtype=torch.float32, device=q.device)
    layout = gl.NVMMASharedLayout.get_default_for([T, T], gl.bfloat16)
    kv_desc = TensorDescriptor.from_tensor(kv_cache.view(-1, 576), [T, T], layout)
    _mla_ahead[(hb, n_splits, B)](
        q, kv_desc, block_table, seq_lens, out, op, lp, H, n_splits, per * T,
        scale * 1.4426950408889634, q.stride(0), q.stride(1), block_table.stride(0),
        out.stride(0), out.stride(1), PAGE=page, STAGES=STAGES, ONE=one, PROBE=PROBE,
        num_warps=4, maxnreg=REGS)
    if not one:
        spad = 1 << (n_splits - 1).bit_length()
        _mla_ahead_merge[(B * H,)](op, lp, out, H, n_splits, out.stride(0), out.stride(1),
                                   SPAD=max(spad, 128), num_warps=4)
    return out
