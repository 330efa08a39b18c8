"""Issue 35's experiment (not shipped): gluon_pingpong without its loader warp. Each warpgroup
reloads by TMA the blocks it read last (its half of V after its P V, block 8 after reading the
other's P), so the kernel has 8 warps and 240 registers a thread instead of 12 warps sharing
384 x 168 (232 a consumer warpgroup beside a 40-register loader, benchmarks/experiments/
gluon_partition_regs.py): spills 136 -> 76 bytes. Correct on FlashMLA-style inputs, but 8-12% slower on the H200
(benchmarks/results/mla-gluon-h200-2026-12-03/noloader.json): the reloads sit on the
warpgroups' own critical path. Timed by benchmarks/bench_mla_ablate.py --kernels.

The text of gluon_pingpong follows.

MLA decode in Gluon (Hopper), warp-specialized ping-pong: three partitions per program of 64
query heads x one split of the context.

- a loader warp brings q (once) and each [64, 576] latent tile (one 64-token piece of a page) by
  TMA as nine [64, 64] column blocks into a STAGES-deep ring, completing on an mbarrier;
- two consumer warpgroups take the tiles in turn: the tile's owner (even tiles: warpgroup 0, odd:
  warpgroup 1) computes S = q K^T over all 576 columns (a full 64 x 64 tile per warpgroup, no
  cross-warpgroup reduction), its softmax against the running max the other one left in shared
  memory, and writes P (over the tile's rope block, which nobody reads after S) with the row max
  and rescale factor; then both do O += P V on their own half of V's 512 columns. While one
  warpgroup is in its softmax the other's matrix products keep the tensor cores busy.

Rows past a sequence's end in its last tile may hold anything (NaN in FlashMLA's tests): their
scores are masked and the owner zeroes their V rows before P V (0 * NaN is NaN). Needs a page of
a multiple of 64 tokens (a tile is one piece of one page); the family offers it only there.
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
NBLK = gl.constexpr(9)
WREGS = gl.constexpr(240)  # the second warpgroup's registers (no loader warp: 8 warps, up to 255 each)  # 576 / 64 column blocks: 0-7 the latent (V), 8 the rope part


@gluon.jit
def _reload(kv_desc, blk, kv_s, rdy, t, first: gl.constexpr, nblk: gl.constexpr, start,
            PAGE: gl.constexpr, STAGES: gl.constexpr):
    """TMA column blocks first .. first + nblk - 1 of tile t (in page blk) into its stage,
    completing on rdy (the issuing warpgroup's generic accesses of them fenced first)."""
    s = t % STAGES
    n0 = start + t * TILE
    row = blk * PAGE + n0 % PAGE
    fence_async_shared()
    mbarrier.expect(rdy.index(s), nblk * TILE * TILE * 2)
    for c in gl.static_range(first, first + nblk):
        tma.async_copy_global_to_shared(kv_desc, [row, c * TILE], rdy.index(s),
                                        kv_s.index(s * NBLK + c))


@gluon.jit
def _consume(W: gl.constexpr, kv_desc, bt, q_s, kv_s, m_s, a_s, l_s, readyL, readyR, ready8,
             pready, fin, O, Op, Lp, b, hb, H, s_id, n_splits, start, end, n_tiles, qk_scale,
             sob, soh, PAGE: gl.constexpr, STAGES: gl.constexpr, ONE: gl.constexpr):
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
    for t in range(n_tiles):
        s = t % STAGES
        ph = (t // STAGES) & 1
        base = s * NBLK
        # the page of tile t + STAGES, read now: its latency hides behind this tile's work
        nblk = gl.load(bt + (start + (t + STAGES) * TILE) // PAGE, mask=t + STAGES < n_tiles,
                       other=0)
        if t % 2 == W:
            mbarrier.wait(readyL.index(s), ph)
            mbarrier.wait(readyR.index(s), ph)
            mbarrier.wait(ready8.index(s), ph)
            sc = warpgroup_mma(q_s.index(0), kv_s.index(base).permute((1, 0)), zero,
                               use_acc=False, is_async=True)
            for c in gl.static_range(1, NBLK):
                sc = warpgroup_mma(q_s.index(c), kv_s.index(base + c).permute((1, 0)), sc,
                                   is_async=True)
            sc = warpgroup_mma_wait(num_outstanding=0, deps=(sc,))
            n0 = start + t * TILE
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
        else:
            mbarrier.wait(pready.index(s), ph)
            alpha = a_s.index(s).load(R_L)
            m_i = m_s.index(s).load(R_L)
            l_i = l_i * alpha
            pa = kv_s.index(base + NBLK - 1).load(P_L)
            if t + STAGES < n_tiles:  # block 8 (rope, then P) was last read here
                gl.thread_barrier()
                _reload(kv_desc, nblk, kv_s, ready8, t + STAGES, NBLK - 1, 1, start, PAGE, STAGES)
        acc0 = warpgroup_mma(pa, kv_s.index(base + 4 * W), acc0 * alpha[:, None], is_async=True)
        acc1 = warpgroup_mma(pa, kv_s.index(base + 4 * W + 1), acc1 * alpha[:, None],
                             is_async=True)
        acc2 = warpgroup_mma(pa, kv_s.index(base + 4 * W + 2), acc2 * alpha[:, None],
                             is_async=True)
        acc3 = warpgroup_mma(pa, kv_s.index(base + 4 * W + 3), acc3 * alpha[:, None],
                             is_async=True)
        acc0, acc1, acc2, acc3 = warpgroup_mma_wait(num_outstanding=0,
                                                    deps=(acc0, acc1, acc2, acc3))
        if t + STAGES < n_tiles:  # this half of V was last read here (S read it before P)
            gl.thread_barrier()
            if W == 0:
                _reload(kv_desc, nblk, kv_s, readyL, t + STAGES, 0, 4, start, PAGE, STAGES)
            else:
                _reload(kv_desc, nblk, kv_s, readyR, t + STAGES, 4, 4, start, PAGE, STAGES)

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
def _default(kv_desc, bt, q_s, kv_s, m_s, a_s, l_s, readyL, readyR, ready8, pready, fin, O,
             Op, Lp, b, hb, H, s_id, n_splits, start, end, n_tiles, qk_scale, sob, soh,
             PAGE: gl.constexpr, STAGES: gl.constexpr, ONE: gl.constexpr):
    _consume(0, kv_desc, bt, q_s, kv_s, m_s, a_s, l_s, readyL, readyR, ready8, pready, fin, O,
             Op, Lp, b, hb, H, s_id, n_splits, start, end, n_tiles, qk_scale, sob, soh, PAGE,
             STAGES, ONE)


@gluon.jit
def _second(kv_desc, bt, q_s, kv_s, m_s, a_s, l_s, readyL, readyR, ready8, pready, fin, O,
            Op, Lp, b, hb, H, s_id, n_splits, start, end, n_tiles, qk_scale, sob, soh,
            PAGE: gl.constexpr, STAGES: gl.constexpr, ONE: gl.constexpr):
    _consume(1, kv_desc, bt, q_s, kv_s, m_s, a_s, l_s, readyL, readyR, ready8, pready, fin, O,
             Op, Lp, b, hb, H, s_id, n_splits, start, end, n_tiles, qk_scale, sob, soh, PAGE,
             STAGES, ONE)


@gluon.jit
def _mla_pingpong(Q, kv_desc, BT, SL, O, Op, Lp, H, n_splits, split_len, qk_scale, sqb, sqh,
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
    readyL = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    readyR = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    ready8 = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    pready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    fin = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(readyL.index(i), count=1)
        mbarrier.init(readyR.index(i), count=1)
        mbarrier.init(ready8.index(i), count=1)
        mbarrier.init(pready.index(i), count=1)
    mbarrier.init(fin, count=2)
    QL: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
    hq = hb * TILE + gl.arange(0, TILE, layout=gl.SliceLayout(1, QL))
    cq = gl.arange(0, TILE, layout=gl.SliceLayout(0, QL))
    qrow = Q + b.to(gl.int64) * sqb + hq[:, None] * sqh + cq[None, :]
    for c in gl.static_range(NBLK):
        q_s.index(c).store(gl.load(qrow + c * TILE, mask=(hq < H)[:, None], other=0.0))
    bt = BT + b.to(gl.int64) * sbt
    # the first STAGES tiles by these warps; later ones by whoever read a block last
    for i in gl.static_range(STAGES):
        if i < n_tiles:
            blk0 = gl.load(bt + (start + i * TILE) // PAGE)
            _reload(kv_desc, blk0, kv_s, readyL, i, 0, 4, start, PAGE, STAGES)
            _reload(kv_desc, blk0, kv_s, readyR, i, 4, 4, start, PAGE, STAGES)
            _reload(kv_desc, blk0, kv_s, ready8, i, NBLK - 1, 1, start, PAGE, STAGES)
    fence_async_shared()
    gl.warp_specialize([
        (_default, (kv_desc, bt, q_s, kv_s, m_s, a_s, l_s, readyL, readyR, ready8, pready, fin,
                    O, Op, Lp, b, hb, H, s_id, n_splits, start, end, n_tiles, qk_scale, sob,
                    soh, PAGE, STAGES, ONE)),
        (_second, (kv_desc, bt, q_s, kv_s, m_s, a_s, l_s, readyL, readyR, ready8, pready, fin,
                   O, Op, Lp, b, hb, H, s_id, n_splits, start, end, n_tiles, qk_scale, sob,
                   soh, PAGE, STAGES, ONE)),
    ], [4], [WREGS])


@gluon.jit
def _mla_pingpong_merge(Op, Lp, O, H, n_splits, sob, soh, SPAD: gl.constexpr,
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


def forward(q, kv_cache, block_table, seq_lens, scale, *, GRID: int = 132, STAGES: int = 2,
            REGS: int = 240, PROBE: int = 0):
    B, H = q.shape[0], q.shape[1]
    page = kv_cache.shape[1]
    assert page % T == 0 and kv_cache.data_ptr() % 16 == 0
    cap = block_table.shape[1] * page
    hb = (H + T - 1) // T
    tiles = (cap + T - 1) // T
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
    _mla_pingpong[(hb, n_splits, B)](
        q, kv_desc, block_table, seq_lens, out, op, lp, H, n_splits, per * T,
        scale * 1.4426950408889634, q.stride(0), q.stride(1), block_table.stride(0),
        out.stride(0), out.stride(1), PAGE=page, STAGES=STAGES, ONE=one, PROBE=PROBE,
        num_warps=4, maxnreg=REGS)
    if not one:
        spad = 1 << (n_splits - 1).bit_length()
        _mla_pingpong_merge[(B * H,)](op, lp, out, H, n_splits, out.stride(0), out.stride(1),
                                      SPAD=max(spad, 128), num_warps=4)
    return out
