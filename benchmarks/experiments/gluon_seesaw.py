"""Issue 45's experiment (not shipped, never run on a GPU): dense MLA decode at 128 heads in
Gluon (Hopper) with FlashMLA's "seesaw" schedule, built to see whether it escapes
gluon_pingpong's register ceiling. Compiled for sm_90 by benchmarks/experiments/
gluon_partition_regs.py and tests/kernelsearch/test_mla_seesaw.py; docs/mla-round3.md has the
numbers.

Three partitions per program of 64 query heads x one split of the context, as gluon_pingpong:
a loader warp brings each [64, 576] latent tile by TMA as nine [64, 64] column blocks into a
two-stage ring (tile t in stage t % 2); two consumer warpgroups each own half of the output,
64 heads x 256 columns (O_W, one [64, 256] fp32 accumulator, P V one 64 x 256 wgmma a tile
as in FlashMLA). Unlike the ping-pong, they take the tiles a *pair* at a time, both at once
(FlashMLA's sm90 dense decode schedule; LEAN=0):

  warpgroup 0 (tile a = 2j)            warpgroup 1 (tile b = 2j + 1)
  S_a = q K_a^T                        S_b = q K_b^T              (both on the tensor cores)
  m0 = max(m, rowmax S_a), P_a         .
  publish m0, alpha0 ------------>     wait; m1 = max(m0, rowmax S_b), P_b
  O_0 = O_0 alpha0 + P_a V_a[0:256]    publish m1, alpha1; P_b into smem
  wait alpha1 <-------------------     O_1 = O_1 alpha0 alpha1 + P_b V_b[256:512]
  P_a *= alpha1, into smem ------->    O_1 += P_a V_a[256:512]    (P_a from smem)
  O_0 = O_0 alpha1 + P_b V_b[0:256]    (P_b from smem)

so warpgroup 0's softmax runs while warpgroup 1's S is on the tensor cores and the other way
round, and neither holds more than its half of O (as in the ping-pong: this does not split the
accumulator further). LEAN=0 is FlashMLA's order: warpgroup 0 keeps P_a in fp32 until warpgroup
1's factor has rescaled it, then publishes it (four exchange mbarriers a pair). LEAN=1 publishes
P_a at once against m0 and keeps nothing: warpgroup 1 computes O_1 = (O_1 a0 + P_a V_a) a1 +
P_b V_b and every P V reads P from shared memory (two exchange mbarriers a pair, one more O
rescale). P goes over its tile's rope block (block 8, read by nobody after S).

Tile 2j sits in stage 0 and 2j + 1 in stage 1, each [64, 64] block landing on its own mbarrier;
a block group is reloaded once its last readers released it: V's left half (blocks 0-3) by
warpgroup 0 after its P V on it, the right half by warpgroup 1, block 8 by both. Warpgroup 0's
next S (which the pair waits for) reads stage 0, released first. LOADER=1 (default): a loader
warp reloads (12 warps: 232 registers a consumer warpgroup, 40 the loader, as gluon_pingpong).
LOADER=0: FlashMLA's layout, 8 warps and no loader (240 registers a consumer warpgroup, as
mla_pingpong_noloader.py): the default warps load the first two tiles and each group's last
reader reloads it with the tile two on (block 8 by warpgroup 1 for stage 0, 0 for stage 1,
once the other has released it too). Every wgmma is waited before
each mbarrier wait (ptxas serializes a kernel's wgmma when one stays in flight across a branch,
see gluon_ahead.py), so a warpgroup's own matrix products do not overlap its own waits: the
overlap is between the two warpgroups only.

Rows past a sequence's end in its last tile may hold anything (NaN in FlashMLA's tests): their
scores are masked and each warpgroup zeroes its own half of V's rows there before any P V (an
odd count leaves tile b past the end: all its scores masked, all its V rows zeroed; the other
warpgroup's S may read those rows meanwhile, and masks whatever it reads). Pages of a
multiple of 64 tokens. Chunks merged by log-sum-exp as gluon_pingpong (its merge kernel)."""
import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma,
                                                              warpgroup_mma, warpgroup_mma_wait)

TILE = gl.constexpr(64)  # tokens a tile, heads a program, columns a TMA block
T = 64  # TILE for host code (a plain int)
NBLK = gl.constexpr(9)  # 576 / 64 column blocks: 0-7 the latent (V), 8 the rope part
WREGS = gl.constexpr(240)  # the second warpgroup's registers without the loader warp


@gluon.jit
def _s(q_s, kv_s, base, zero):
    """S = q K^T over the nine blocks of the tile at kv_s[base:], waited for."""
    sc = warpgroup_mma(q_s.index(0), kv_s.index(base).permute((1, 0)), zero, use_acc=False,
                       is_async=True)
    for c in gl.static_range(1, NBLK):
        sc = warpgroup_mma(q_s.index(c), kv_s.index(base + c).permute((1, 0)), sc, is_async=True)
    return warpgroup_mma_wait(num_outstanding=0, deps=(sc,))


@gluon.jit
def _pv(W: gl.constexpr, pa, kv_s, base, scale, acc, RESCALE: gl.constexpr = True):
    """O_W = O_W * scale + P V_W over this warpgroup's half of V of the tile at kv_s[base:],
    waited for: one 64 x 256 wgmma (FlashMLA's shape; four 64 x 64 ones spill twice as much)
    on its four [64, 64] blocks seen as one [64, 256] tile (Triton's NVMMA layout of a
    [64, 256] tile is those four 128-byte-swizzled blocks one after the other: its TMA copy of
    one is four [64, 64] messages 8 KB apart). pa: P in registers (a dot operand) or in
    shared memory."""
    O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, 256, 16])
    V_L: gl.constexpr = gl.NVMMASharedLayout.get_default_for([TILE, 256], gl.bfloat16)
    if RESCALE:
        acc = acc * gl.convert_layout(scale, gl.SliceLayout(1, O_L))[:, None]
    v = kv_s.index(base + 4 * W)._reinterpret(kv_s.dtype, [TILE, 256], V_L)
    acc = warpgroup_mma(pa, v, acc, is_async=True)
    return warpgroup_mma_wait(num_outstanding=0, deps=(acc,))


@gluon.jit
def _zero_half(W: gl.constexpr, kv_s, base, n0, end, Z_L: gl.constexpr):
    """The rows past the end of the tile at kv_s[base:] zeroed in this warpgroup's V half."""
    if n0 + TILE > end:
        zr = n0 + gl.arange(0, TILE, layout=gl.SliceLayout(1, Z_L))
        for c in gl.static_range(4):
            blk = kv_s.index(base + 4 * W + c)
            v = blk.load(Z_L)
            blk.store(gl.where((zr < end)[:, None], v, gl.zeros_like(v)))


@gluon.jit
def _wait_blocks(ready, base, ph, lo: gl.constexpr, hi: gl.constexpr):
    """The column blocks lo .. hi - 1 of the tile at kv_s[base:] have landed."""
    for c in gl.static_range(lo, hi):
        mbarrier.wait(ready.index(base + c), ph)


@gluon.jit
def _done(kv_desc, bt, kv_s, ready, free, g: gl.constexpr, s, t, start, n_tiles,
          PAGE: gl.constexpr, LOADER: gl.constexpr, RELOAD: gl.constexpr):
    """Block group g (0: V's left half, 1: its right half, 2: block 8) of stage s, tile t, read
    by every warp of this warpgroup. LOADER: the loader warp is told. Else the group's last
    reader (RELOAD) brings tile t + 2's blocks itself (block 8: once both have said so)."""
    gl.thread_barrier()
    if LOADER:
        mbarrier.arrive(free.index(2 * g + s), count=1)
    else:
        if g == 2:
            mbarrier.arrive(free.index(4 + s), count=1)
        if RELOAD:
            if g == 2:
                mbarrier.wait(free.index(4 + s), (t // 2) & 1)
            if t + 2 < n_tiles:
                n0 = start + (t + 2) * TILE
                blk = gl.load(bt + n0 // PAGE)
                fence_async_shared()  # this warpgroup's generic accesses before the TMA writes
                _tma_group(kv_desc, blk * PAGE + n0 % PAGE, kv_s, ready, s, g)


@gluon.jit
def _tma_group(kv_desc, row, kv_s, ready, s, g: gl.constexpr):
    """Block group g of the tile at cache row `row` into stage s, each block on its barrier."""
    for c in gl.static_range(4 * g, 4 * g + 4 - 3 * (g // 2)):
        mbarrier.expect(ready.index(s * NBLK + c), TILE * TILE * 2)
        tma.async_copy_global_to_shared(kv_desc, [row, c * TILE], ready.index(s * NBLK + c),
                                        kv_s.index(s * NBLK + c))


@gluon.jit
def _consume(W: gl.constexpr, kv_desc, bt, q_s, kv_s, x_s, l_s, ready, free, xbar, fin,
             O, Op, Lp, b, hb, H, s_id, n_splits, start, end, n_tiles, qk_scale, sob, soh,
             PAGE: gl.constexpr, STAGES: gl.constexpr, ONE: gl.constexpr, LEAN: gl.constexpr,
             LOADER: gl.constexpr):
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
    O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, 256, 16])
    acc = gl.zeros([TILE, 256], gl.float32, layout=O_L)  # O_W: this warpgroup's half
    # x_s rows: 0 m0, 1 alpha0 (warpgroup 0's), 2 m1, 3 alpha1 (warpgroup 1's)
    # xbar: 0 m0/alpha0 published, 1 m1/alpha1, 2 P_a in smem, 3 P_b in smem
    for j in range((n_tiles + 1) // 2):
        ta = 2 * j
        tb = ta + 1
        # tile a in stage 0, b in 1, written so the compiler cannot fold it (a constant stage
        # has ptxas hoist all ~70 wgmma descriptors out of the loop and spill them: 1,268
        # bytes); j < 2^30
        sa = (j >> 30) & 1
        sb = 1 - sa
        ba = sa * NBLK
        bb = sb * NBLK
        n0a = start + ta * TILE
        n0b = n0a + TILE
        xph = j & 1
        if W == 0:
            _wait_blocks(ready, ba, xph, 0, NBLK)
            sc = _s(q_s, kv_s, ba, zero)
            n = n0a + gl.arange(0, TILE, layout=C_L)
            sc = gl.where((n < end)[None, :], sc * qk_scale, -float("inf"))
            m0 = gl.maximum(m_i, gl.max(sc, axis=1))
            a0 = gl.exp2(m_i - m0)
            p = gl.exp2(sc - m0[:, None])
            if LEAN:  # P_a as it is (against m0) to warpgroup 1 at once; nothing kept
                l_i = l_i * a0 + gl.sum(p, axis=1)
                kv_s.index(ba + NBLK - 1).store(p.to(dt))
            x_s.index(0).store(m0)
            x_s.index(1).store(a0)
            fence_async_shared()
            gl.thread_barrier()
            mbarrier.arrive(xbar.index(0), count=1)
            # this warpgroup's V halves of both tiles zeroed past the end, before any P V
            _zero_half(W, kv_s, ba, n0a, end, Z_L)
            if tb < n_tiles:
                _wait_blocks(ready, bb, xph, 0, 4)
            _zero_half(W, kv_s, bb, n0b, end, Z_L)
            fence_async_shared()
            gl.thread_barrier()
            if LEAN:
                acc = _pv(W, kv_s.index(ba + NBLK - 1), kv_s, ba, a0, acc)
                _done(kv_desc, bt, kv_s, ready, free, 0, sa, ta, start, n_tiles, PAGE, LOADER,
                      True)  # V_a's left half: read by nobody else
                _done(kv_desc, bt, kv_s, ready, free, 2, sa, ta, start, n_tiles, PAGE, LOADER,
                      False)  # P_a read (warpgroup 1 reloads)
                mbarrier.wait(xbar.index(1), xph)  # warpgroup 1's max over both tiles, P_b
                m_i = x_s.index(2).load(R_L)
                a1 = x_s.index(3).load(R_L)
                l_i = l_i * a1
            else:  # FlashMLA's: P_a kept (fp32) until warpgroup 1's factor rescales it
                acc = _pv(W, gl.convert_layout(p.to(dt), P_L), kv_s, ba, a0, acc)
                _done(kv_desc, bt, kv_s, ready, free, 0, sa, ta, start, n_tiles, PAGE, LOADER,
                      True)
                mbarrier.wait(xbar.index(1), xph)  # warpgroup 1's max over both tiles
                m_i = x_s.index(2).load(R_L)
                a1 = x_s.index(3).load(R_L)
                p = p * a1[:, None]
                l_i = l_i * (a0 * a1) + gl.sum(p, axis=1)
                kv_s.index(ba + NBLK - 1).store(p.to(dt))
                fence_async_shared()
                gl.thread_barrier()
                mbarrier.arrive(xbar.index(2), count=1)
                _done(kv_desc, bt, kv_s, ready, free, 2, sa, ta, start, n_tiles, PAGE, LOADER,
                      False)  # P_a written, not read here
                mbarrier.wait(xbar.index(3), xph)
            acc = _pv(W, kv_s.index(bb + NBLK - 1), kv_s, bb, a1, acc)
            _done(kv_desc, bt, kv_s, ready, free, 0, sb, tb, start, n_tiles, PAGE, LOADER,
                  True)  # V_b's left half, after warpgroup 1's S (xbar 1)
            _done(kv_desc, bt, kv_s, ready, free, 2, sb, tb, start, n_tiles, PAGE, LOADER,
                  True)
        else:
            if tb < n_tiles:
                _wait_blocks(ready, bb, xph, 0, NBLK)
            # past the end (an odd count) S reads a stale stage: every score is masked
            sc = _s(q_s, kv_s, bb, zero)
            n = n0b + gl.arange(0, TILE, layout=C_L)
            sc = gl.where((n < end)[None, :], sc * qk_scale, -float("inf"))
            _zero_half(W, kv_s, bb, n0b, end, Z_L)
            _wait_blocks(ready, ba, xph, 4, 8)
            # (tile a's rows past the end only; warpgroup 0's S_a may read them meanwhile:
            # its scores there are masked whatever it reads)
            _zero_half(W, kv_s, ba, n0a, end, Z_L)
            mbarrier.wait(xbar.index(0), xph)  # warpgroup 0's max over tile a
            m0 = x_s.index(0).load(R_L)
            a0 = x_s.index(1).load(R_L)
            m_i = gl.maximum(m0, gl.max(sc, axis=1))
            a1 = gl.exp2(m0 - m_i)
            p = gl.exp2(sc - m_i[:, None])
            l_i = l_i * (a0 * a1) + gl.sum(p, axis=1)
            x_s.index(2).store(m_i)
            x_s.index(3).store(a1)
            pb = p.to(dt)
            kv_s.index(bb + NBLK - 1).store(pb)
            fence_async_shared()
            gl.thread_barrier()
            mbarrier.arrive(xbar.index(1), count=1)
            if LEAN:  # O_1 = (O_1 a0 + P_a V_a) a1 + P_b V_b, both P from shared memory
                acc = _pv(W, kv_s.index(ba + NBLK - 1), kv_s, ba, a0, acc)
                _done(kv_desc, bt, kv_s, ready, free, 1, sa, ta, start, n_tiles, PAGE, LOADER,
                      True)  # V_a's right half, after warpgroup 0's S
                _done(kv_desc, bt, kv_s, ready, free, 2, sa, ta, start, n_tiles, PAGE, LOADER,
                      True)
                acc = _pv(W, kv_s.index(bb + NBLK - 1), kv_s, bb, a1, acc)
                _done(kv_desc, bt, kv_s, ready, free, 1, sb, tb, start, n_tiles, PAGE, LOADER,
                      True)
                _done(kv_desc, bt, kv_s, ready, free, 2, sb, tb, start, n_tiles, PAGE, LOADER,
                      False)
            else:
                mbarrier.arrive(xbar.index(3), count=1)
                _done(kv_desc, bt, kv_s, ready, free, 2, sb, tb, start, n_tiles, PAGE, LOADER,
                      False)  # P_b written, not read here
                acc = _pv(W, gl.convert_layout(pb, P_L), kv_s, bb, a0 * a1, acc)
                _done(kv_desc, bt, kv_s, ready, free, 1, sb, tb, start, n_tiles, PAGE, LOADER,
                      True)
                mbarrier.wait(xbar.index(2), xph)
                acc = _pv(W, kv_s.index(ba + NBLK - 1), kv_s, ba, a1, acc, RESCALE=False)
                _done(kv_desc, bt, kv_s, ready, free, 1, sa, ta, start, n_tiles, PAGE, LOADER,
                      True)
                _done(kv_desc, bt, kv_s, ready, free, 2, sa, ta, start, n_tiles, PAGE, LOADER,
                      True)

    # l: each warpgroup summed its own tiles' rows (rescaled by every later factor)
    l_s.index(W).store(l_i)
    gl.thread_barrier()
    mbarrier.arrive(fin, count=1)
    mbarrier.wait(fin, 0)
    OR_L: gl.constexpr = gl.SliceLayout(1, O_L)
    l_t = l_s.index(0).load(OR_L) + l_s.index(1).load(OR_L)
    safe = gl.where(l_t > 0, l_t, 1.0)
    h = hb * TILE + gl.arange(0, TILE, layout=OR_L)
    hmask = (h < H)[:, None]
    d = W * 256 + gl.arange(0, 256, layout=gl.SliceLayout(0, O_L))
    if ONE:
        gl.store(O + b.to(gl.int64) * sob + h[:, None] * soh + d[None, :],
                 (acc / safe[:, None]).to(O.dtype.element_ty), mask=hmask)
    else:
        prow = (b.to(gl.int64) * H + h) * n_splits + s_id
        if W == 0:
            m_o = gl.convert_layout(m_i, OR_L)
            gl.store(Lp + prow, gl.where(l_t > 0, m_o + gl.log2(safe), -float("inf")),
                     mask=h < H)
        gl.store(Op + prow[:, None] * 512 + d[None, :], acc / safe[:, None], mask=hmask)


@gluon.jit
def _default(kv_desc, bt, q_s, kv_s, x_s, l_s, ready, free, xbar, fin, O, Op, Lp, b, hb, H,
            s_id, n_splits, start, end, n_tiles, qk_scale, sob, soh, PAGE: gl.constexpr,
            STAGES: gl.constexpr, ONE: gl.constexpr, LEAN: gl.constexpr,
            LOADER: gl.constexpr):
    _consume(0, kv_desc, bt, q_s, kv_s, x_s, l_s, ready, free, xbar, fin, O, Op, Lp, b, hb, H,
             s_id, n_splits, start, end, n_tiles, qk_scale, sob, soh, PAGE, STAGES, ONE, LEAN,
             LOADER)


@gluon.jit
def _second(kv_desc, bt, q_s, kv_s, x_s, l_s, ready, free, xbar, fin, O, Op, Lp, b, hb, H,
            s_id, n_splits, start, end, n_tiles, qk_scale, sob, soh, PAGE: gl.constexpr,
            STAGES: gl.constexpr, ONE: gl.constexpr, LEAN: gl.constexpr,
            LOADER: gl.constexpr):
    _consume(1, kv_desc, bt, q_s, kv_s, x_s, l_s, ready, free, xbar, fin, O, Op, Lp, b, hb, H,
             s_id, n_splits, start, end, n_tiles, qk_scale, sob, soh, PAGE, STAGES, ONE, LEAN,
             LOADER)


@gluon.jit
def _loader(kv_desc, bt, q_s, kv_s, x_s, l_s, ready, free, xbar, fin, O, Op, Lp, b, hb, H,
            s_id, n_splits, start, end, n_tiles, qk_scale, sob, soh, PAGE: gl.constexpr,
            STAGES: gl.constexpr, ONE: gl.constexpr, LEAN: gl.constexpr,
            LOADER: gl.constexpr):
    for t in range(n_tiles):
        s = t % 2  # tile 2j in stage 0, 2j + 1 in 1
        fph = ((t // 2) & 1) ^ 1
        n0 = start + t * TILE
        blk = gl.load(bt + n0 // PAGE)
        row = blk * PAGE + n0 % PAGE
        # each block group reloads once its last readers released it (see _consume)
        for g in gl.static_range(3):
            mbarrier.wait(free.index(2 * g + s), fph)
            fence_async_shared()  # their generic reads/writes of it before the TMA writes
            _tma_group(kv_desc, row, kv_s, ready, s, g)


@gluon.jit
def _mla_seesaw(Q, kv_desc, BT, SL, O, Op, Lp, H, n_splits, split_len, qk_scale, sqb, sqh,
                sbt, sob, soh, PAGE: gl.constexpr, STAGES: gl.constexpr, ONE: gl.constexpr,
                LEAN: gl.constexpr, LOADER: gl.constexpr, num_warps: gl.constexpr):
    gl.static_assert(STAGES == 2, "a pair of tiles in the two stages")
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
    x_s = gl.allocate_shared_memory(gl.float32, [4, TILE], V_S)
    l_s = gl.allocate_shared_memory(gl.float32, [2, TILE], V_S)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES * NBLK, 1], mbarrier.MBarrierLayout())
    free = gl.allocate_shared_memory(gl.int64, [3 * STAGES, 1], mbarrier.MBarrierLayout())
    xbar = gl.allocate_shared_memory(gl.int64, [4, 1], mbarrier.MBarrierLayout())
    fin = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES * NBLK):
        mbarrier.init(ready.index(i), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(free.index(i), count=1)  # V's left half: warpgroup 0 reads it last
        mbarrier.init(free.index(2 + i), count=1)  # right half: warpgroup 1
        mbarrier.init(free.index(4 + i), count=2)  # block 8 (rope, then P): both
    for i in gl.static_range(4):
        mbarrier.init(xbar.index(i), count=1)
    mbarrier.init(fin, count=2)
    # q once into shared memory by the default partition's warps, before the partitions start
    QL: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
    hq = hb * TILE + gl.arange(0, TILE, layout=gl.SliceLayout(1, QL))
    cq = gl.arange(0, TILE, layout=gl.SliceLayout(0, QL))
    qrow = Q + b.to(gl.int64) * sqb + hq[:, None] * sqh + cq[None, :]
    for c in gl.static_range(NBLK):
        q_s.index(c).store(gl.load(qrow + c * TILE, mask=(hq < H)[:, None], other=0.0))
    bt = BT + b.to(gl.int64) * sbt
    if not LOADER:  # the first two tiles by these warps; later ones by their last readers
        for i in gl.static_range(2):
            if i < n_tiles:
                n0 = start + i * TILE
                row = gl.load(bt + n0 // PAGE) * PAGE + n0 % PAGE
                for g in gl.static_range(3):
                    _tma_group(kv_desc, row, kv_s, ready, i, g)
    fence_async_shared()
    # (the arguments spelled out: through a tuple variable the constexprs arrive as values)
    if LOADER:
        gl.warp_specialize([
            (_default, (kv_desc, bt, q_s, kv_s, x_s, l_s, ready, free, xbar, fin, O, Op, Lp, b,
                        hb, H, s_id, n_splits, start, end, n_tiles, qk_scale, sob, soh, PAGE,
                        STAGES, ONE, LEAN, LOADER)),
            (_second, (kv_desc, bt, q_s, kv_s, x_s, l_s, ready, free, xbar, fin, O, Op, Lp, b,
                       hb, H, s_id, n_splits, start, end, n_tiles, qk_scale, sob, soh, PAGE,
                       STAGES, ONE, LEAN, LOADER)),
            (_loader, (kv_desc, bt, q_s, kv_s, x_s, l_s, ready, free, xbar, fin, O, Op, Lp, b,
                       hb, H, s_id, n_splits, start, end, n_tiles, qk_scale, sob, soh, PAGE,
                       STAGES, ONE, LEAN, LOADER)),
        ], [4, 1], [232, 40])
    else:  # 8 warps as FlashMLA's: up to 255 registers a thread (240 here, a multiple of 8)
        gl.warp_specialize([
            (_default, (kv_desc, bt, q_s, kv_s, x_s, l_s, ready, free, xbar, fin, O, Op, Lp, b,
                        hb, H, s_id, n_splits, start, end, n_tiles, qk_scale, sob, soh, PAGE,
                        STAGES, ONE, LEAN, LOADER)),
            (_second, (kv_desc, bt, q_s, kv_s, x_s, l_s, ready, free, xbar, fin, O, Op, Lp, b,
                       hb, H, s_id, n_splits, start, end, n_tiles, qk_scale, sob, soh, PAGE,
                       STAGES, ONE, LEAN, LOADER)),
        ], [4], [WREGS])


def forward(q, kv_cache, block_table, seq_lens, scale, *, GRID: int = 264, STAGES: int = 2,
            REGS: int = 0, LEAN: int = 1, LOADER: int = 1):
    """out [B, H, 512]; any H (masked rows past it); pages of a multiple of 64 tokens.
    gluon_pingpong's interface and split; its merge kernel combines the chunks. REGS: the
    launch's register cap (0: 168 with the loader warp, 240 without). Never run on a GPU."""
    from kernelsearch.families.mla_decode.gluon_pingpong import _mla_pingpong_merge

    B, H = q.shape[0], q.shape[1]
    page = kv_cache.shape[1]
    if page % T:
        raise ValueError(f"gluon_seesaw needs pages of a multiple of {T} tokens, not {page}")
    if kv_cache.data_ptr() % 16:  # TMA reads 16-byte aligned rows (an offset view)
        kv_cache = kv_cache.clone()
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
    _mla_seesaw[(hb, n_splits, B)](
        q, kv_desc, block_table, seq_lens, out, op, lp, H, n_splits, per * T,
        scale * 1.4426950408889634, q.stride(0), q.stride(1), block_table.stride(0),
        out.stride(0), out.stride(1), PAGE=page, STAGES=STAGES, ONE=one, LEAN=LEAN,
        LOADER=LOADER, num_warps=4, maxnreg=REGS or (168 if LOADER else 240))
    if not one:
        spad = 1 << (n_splits - 1).bit_length()
        _mla_pingpong_merge[(B * H,)](op, lp, out, H, n_splits, out.stride(0), out.stride(1),
                                      SPAD=max(spad, 128), num_warps=4)
    return out
