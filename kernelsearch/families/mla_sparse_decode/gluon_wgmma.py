"""Sparse MLA decode in Gluon (Hopper): mla_decode's gluon_wgmma kernel over the selected rows.
A first small Gluon kernel turns every selected position into its physical cache row (-1 where
skipped: -1, at or past the length); the attention kernel gathers [BLOCK_N, 576] tiles of those
rows by cp.async (skipped slots zero-filled) into a ring that warpgroup MMA reads once for
S = q K^T and O += P V, 64 heads on two warpgroups, split over the top-k with the LSE merge.
`forward_rows` takes physical rows directly (FlashMLA's `indices`)."""
import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, warpgroup_mma,
                                                              warpgroup_mma_wait)

# Triton 3.6's Gluon names (the H200's Triton): 3.9 renamed async_copy_global_to_shared to
# async_load and thread_barrier to barrier; kernelsearch.families.gluon offers this variant
# only where these names exist (and a Hopper GPU, no TRITON_INTERPRET)


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
def _issue(KV, rb, kn_s, kp_s, n0, end, nrows, BLOCK_N: gl.constexpr, LN: gl.constexpr,
           LP: gl.constexpr):
    nn = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, LN))
    r = gl.load(rb + nn, mask=nn < end, other=-1)
    ok = (r >= 0) & (r < nrows)
    row = gl.where(ok, r, 0).to(gl.int64) * 576
    cn = gl.arange(0, 512, layout=gl.SliceLayout(0, LN))
    async_copy.async_copy_global_to_shared(kn_s, KV + row[:, None] + cn[None, :], mask=ok[:, None])
    np_ = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, LP))
    rp = gl.load(rb + np_, mask=np_ < end, other=-1)
    okp = (rp >= 0) & (rp < nrows)
    rowp = gl.where(okp, rp, 0).to(gl.int64) * 576
    cp = 512 + gl.arange(0, 64, layout=gl.SliceLayout(0, LP))
    async_copy.async_copy_global_to_shared(kp_s, KV + rowp[:, None] + cp[None, :], mask=okp[:, None])


@gluon.jit
def _sparse_gluon_partial(Q, KV, RW, O, Op, Lp, H, topk, n_splits, split_len, qk_scale, nrows,
                          sqb, sqh, srb, sob, soh,
                          BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr,
                       STAGES: gl.constexpr, ONE: gl.constexpr, PIPE: gl.constexpr,
                       NOLOAD: gl.constexpr, num_warps: gl.constexpr):
    hb = gl.program_id(0)
    s = gl.program_id(1)
    b = gl.program_id(2)
    # register layouts for the global gathers (16-byte vectors along a row)
    LN: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [num_warps, 1], [1, 0])
    LP: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
    # S [BLOCK_H, BLOCK_N] and O [BLOCK_H, 512]: two warpgroups side by side along N
    S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                  instr_shape=[16, BLOCK_N // 2, 16])
    O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                  instr_shape=[16, 256, 16])
    P_L: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_L, k_width=2)
    QN_S: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, 512], gl.bfloat16)
    QP_S: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, 64], gl.bfloat16)
    KN_S: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, 512], gl.bfloat16)
    KP_S: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, 64], gl.bfloat16)

    start = s * split_len
    end = gl.minimum(start + split_len, topk)
    n_tiles = gl.maximum((end - start + BLOCK_N - 1) // BLOCK_N, 0)

    # q once into shared memory
    hq = hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, LN))
    cq = gl.arange(0, 512, layout=gl.SliceLayout(0, LN))
    qrow = Q + b.to(gl.int64) * sqb + hq[:, None] * sqh
    qn = gl.load(qrow + cq[None, :], mask=(hq < H)[:, None], other=0.0)
    hqp = hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, LP))
    cqp = 512 + gl.arange(0, 64, layout=gl.SliceLayout(0, LP))
    qp = gl.load(Q + b.to(gl.int64) * sqb + hqp[:, None] * sqh + cqp[None, :],
                 mask=(hqp < H)[:, None], other=0.0)
    qn_s = gl.allocate_shared_memory(KV.dtype.element_ty, [BLOCK_H, 512], QN_S, qn)
    qp_s = gl.allocate_shared_memory(KV.dtype.element_ty, [BLOCK_H, 64], QP_S, qp)
    kn_s = gl.allocate_shared_memory(KV.dtype.element_ty, [STAGES, BLOCK_N, 512], KN_S)
    kp_s = gl.allocate_shared_memory(KV.dtype.element_ty, [STAGES, BLOCK_N, 64], KP_S)

    rb = RW + b.to(gl.int64) * srb
    for i in gl.static_range(STAGES - 1):
        _issue(KV, rb, kn_s.index(i), kp_s.index(i), start + i * BLOCK_N, end, nrows, BLOCK_N,
               LN, LP)
        async_copy.commit_group()

    m_i = gl.full([BLOCK_H], -float("inf"), gl.float32, layout=gl.SliceLayout(1, S_L))
    l_i = gl.zeros([BLOCK_H], gl.float32, layout=gl.SliceLayout(1, S_L))
    acc = gl.zeros([BLOCK_H, 512], gl.float32, layout=O_L)
    s_zero = gl.zeros([BLOCK_H, BLOCK_N], gl.float32, layout=S_L)
    if True:
        # software-pipelined: S of tile t+1 is issued right behind P @ V of tile t, so the
        # tensor cores never wait on the softmax's registers between the two
        async_copy.wait_group(STAGES - 2)
        fence_async_shared()
        gl.thread_barrier()
        sc = warpgroup_mma(qn_s, kn_s.index(0).permute((1, 0)), s_zero, use_acc=False,
                           is_async=True)
        sc = warpgroup_mma(qp_s, kp_s.index(0).permute((1, 0)), sc, is_async=True)
        sc = warpgroup_mma_wait(num_outstanding=0, deps=(sc,))
        for t in range(0, n_tiles):
            gl.thread_barrier()  # stage (t - 1) % STAGES is read by nobody now: refill it
            nxt = t + STAGES - 1
            if not NOLOAD:  # NOLOAD: a ceiling probe (no cache reads in the loop; wrong output)
                _issue(KV, rb, kn_s.index(nxt % STAGES), kp_s.index(nxt % STAGES),
                       start + nxt * BLOCK_N, end, nrows, BLOCK_N, LN, LP)
            async_copy.commit_group()
            n = start + t * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, S_L))
            r = gl.load(rb + n, mask=n < end, other=-1)
            sc = gl.where(((r >= 0) & (r < nrows))[None, :], sc * qk_scale, -float("inf"))
            m_new = gl.maximum(m_i, gl.max(sc, axis=1))
            # a tile with no selected row keeps m = -inf: exponentials of 0, not NaN
            m_use = gl.where(m_new > -float("inf"), m_new, 0.0)
            p = gl.exp2(sc - m_use[:, None])
            alpha = gl.exp2(m_i - m_use)
            l_i = l_i * alpha + gl.sum(p, axis=1)
            m_i = m_new
            acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, O_L))[:, None]
            pa = gl.convert_layout(p.to(KV.dtype.element_ty), P_L)
            acc = warpgroup_mma(pa, kn_s.index(t % STAGES), acc, is_async=True)
            async_copy.wait_group(STAGES - 2)  # tile t + 1 has landed
            fence_async_shared()
            gl.thread_barrier()
            k1 = (t + 1) % STAGES
            sc = warpgroup_mma(qn_s, kn_s.index(k1).permute((1, 0)), s_zero, use_acc=False,
                               is_async=True)
            sc = warpgroup_mma(qp_s, kp_s.index(k1).permute((1, 0)), sc, is_async=True)
            acc, sc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, sc))
    async_copy.wait_group(0)

    l_o = gl.convert_layout(l_i, gl.SliceLayout(1, O_L))
    safe = gl.where(l_o > 0, l_o, 1.0)
    out = acc / safe[:, None]
    h = hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, O_L))
    d = gl.arange(0, 512, layout=gl.SliceLayout(0, O_L))
    hmask = h < H
    if ONE:
        gl.store(O + b.to(gl.int64) * sob + h[:, None] * soh + d[None, :],
                 out.to(O.dtype.element_ty), mask=hmask[:, None])
    else:
        m_o = gl.convert_layout(m_i, gl.SliceLayout(1, O_L))
        lse = gl.where(l_o > 0, m_o + gl.log2(safe), -float("inf"))
        prow = (b.to(gl.int64) * H + h) * n_splits + s
        gl.store(Lp + prow, lse, mask=hmask)
        gl.store(Op + prow[:, None] * 512 + d[None, :], out, mask=hmask[:, None])


@gluon.jit
def _sparse_gluon_merge(Op, Lp, O, H, n_splits, sob, soh, SPAD: gl.constexpr,
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


def forward_rows(q, kv_cache, rows, scale, *, BLOCK_H: int = 64, BLOCK_N: int = 64,
                 GRID: int = 264, STAGES: int = 2, num_warps: int = 8):
    """Over physical cache rows [B, topk] int32 (-1 or outside the cache: unused)."""
    B, H = q.shape[0], q.shape[1]
    topk = rows.shape[1]
    hb = (H + BLOCK_H - 1) // BLOCK_H
    tiles = (topk + BLOCK_N - 1) // BLOCK_N
    want = max(1, min((GRID + B * hb - 1) // (B * hb), tiles))
    per = (tiles + want - 1) // want
    n_splits = (tiles + per - 1) // per
    out = torch.empty((B, H, 512), dtype=q.dtype, device=q.device)
    one = n_splits == 1
    nrow = 1 if one else B * H * n_splits
    op = torch.empty((nrow * 512,), dtype=torch.float32, device=q.device)
    lp = torch.empty((nrow,), dtype=torch.float32, device=q.device)
    _sparse_gluon_partial[(hb, n_splits, B)](
        q, kv_cache, rows, out, op, lp, H, topk, n_splits, per * BLOCK_N,
        scale * 1.4426950408889634, kv_cache.shape[0] * kv_cache.shape[1], q.stride(0),
        q.stride(1), rows.stride(0), out.stride(0), out.stride(1),
        BLOCK_H=BLOCK_H, BLOCK_N=BLOCK_N, STAGES=STAGES, ONE=one, PIPE=1, NOLOAD=0,
        num_warps=num_warps)
    if not one:
        spad = 1 << (n_splits - 1).bit_length()
        _sparse_gluon_merge[(B * H,)](op, lp, out, H, n_splits, out.stride(0), out.stride(1),
                                      SPAD=max(spad, 128), num_warps=4)
    return out


def forward(q, kv_cache, block_table, seq_lens, indices, scale, *, BLOCK_H: int = 64,
            BLOCK_N: int = 64, GRID: int = 264, STAGES: int = 2, num_warps: int = 8):
    page = kv_cache.shape[1]
    B, topk = indices.shape[0], indices.shape[1]
    rows = torch.empty((B, topk), dtype=torch.int32, device=q.device)
    _rows_kernel[(B, (topk + 255) // 256)](block_table, seq_lens, indices, rows, topk,
                                           block_table.shape[1] * page, block_table.stride(0),
                                           indices.stride(0), PAGE=page, BLOCK=256, num_warps=4)
    return forward_rows(q, kv_cache, rows, scale, BLOCK_H=BLOCK_H, BLOCK_N=BLOCK_N, GRID=GRID,
                        STAGES=STAGES, num_warps=num_warps)
