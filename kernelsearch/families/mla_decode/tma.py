"""MLA decode, split-KV with Hopper TMA page loads: as splitkv (BLOCK_H heads share each latent
tile in one tl.dot, chunks merged by log-sum-exp), but a whole tile of BLOCK_N tokens lies in one
page when BLOCK_N divides the page size, so it is fetched by the tensor-memory accelerator from
device-built descriptors over the cache as [num_blocks * page, 576] rows (boxes of at most 256
columns: the 512 latent columns as two halves, the 64 rope columns as a third) instead of
per-row pointer loads; WS=1 asks Triton to warp-specialise that loop (producer warps issue
the copies, consumer warps run the dots and the softmax). The last, partial tile of a chunk and pages smaller than BLOCK_N take
masked pointer loads, so every shape is computed by this file's kernels."""
import torch
import triton
import triton.language as tl


@triton.jit
def _step(qn0, qn1, qp, k0, k1, kp, ok, m_i, l_i, acc0, acc1, qk_scale):
    qk = tl.dot(qn0, tl.trans(k0))
    qk = tl.dot(qn1, tl.trans(k1), qk)
    qk = tl.dot(qp, tl.trans(kp), qk)
    qk = tl.where(ok[None, :], qk * qk_scale, -float("inf"))
    m_new = tl.maximum(m_i, tl.max(qk, axis=1))
    p = tl.exp2(qk - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    p = p.to(k0.dtype)
    acc0 = tl.dot(p, k0, acc0 * alpha[:, None])
    acc1 = tl.dot(p, k1, acc1 * alpha[:, None])
    return m_new, l_i, acc0, acc1


@triton.jit(do_not_specialize=["n_splits", "sbt"])  # one binary for any split count and table width
def _tma_partial(Q, KV, BT, SL, O, Op, Lp, H, n_rows, n_splits, split_len, qk_scale,
                 sqb, sqh, sbt, sob, soh,
                 PAGE: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
                 STAGES: tl.constexpr, ONE: tl.constexpr, TMA: tl.constexpr, WS: tl.constexpr):
    hb = tl.program_id(0)
    s = tl.program_id(1)
    b = tl.program_id(2)
    seqlen = tl.load(SL + b)
    start = s * split_len
    end = tl.minimum(start + split_len, seqlen)
    h = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    hmask = h < H
    d0 = tl.arange(0, 256)
    dp = 512 + tl.arange(0, 64)
    qrow = Q + b.to(tl.int64) * sqb + h[:, None] * sqh
    qn0 = tl.load(qrow + d0[None, :], mask=hmask[:, None], other=0.0)
    qn1 = tl.load(qrow + 256 + d0[None, :], mask=hmask[:, None], other=0.0)
    qp = tl.load(qrow + dp[None, :], mask=hmask[:, None], other=0.0)
    m_i = tl.full([BLOCK_H], -float("inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc0 = tl.zeros([BLOCK_H, 256], tl.float32)
    acc1 = tl.zeros([BLOCK_H, 256], tl.float32)
    bt = BT + b.to(tl.int64) * sbt
    full_end = start
    if TMA:
        full_end = start + (tl.maximum(end - start, 0) // BLOCK_N) * BLOCK_N
        dn = tl.make_tensor_descriptor(KV, shape=[n_rows, 576], strides=[576, 1],
                                       block_shape=[BLOCK_N, 256])
        dr = tl.make_tensor_descriptor(KV, shape=[n_rows, 576], strides=[576, 1],
                                       block_shape=[BLOCK_N, 64])
        ok = tl.full([BLOCK_N], 1, tl.int1)
        for n0 in tl.range(start, full_end, BLOCK_N, num_stages=STAGES, warp_specialize=WS):
            r0 = tl.load(bt + n0 // PAGE) * PAGE + n0 % PAGE
            k0 = dn.load([r0, 0])
            k1 = dn.load([r0, 256])
            kp = dr.load([r0, 512])
            m_i, l_i, acc0, acc1 = _step(qn0, qn1, qp, k0, k1, kp, ok, m_i, l_i, acc0, acc1,
                                         qk_scale)
    # pointer tiles: the partial tail of the chunk (all of it when pages are below BLOCK_N)
    for n0 in tl.range(full_end, end, BLOCK_N, num_stages=STAGES):
        n = n0 + tl.arange(0, BLOCK_N)
        nmask = n < end
        blk = tl.load(bt + n // PAGE, mask=nmask, other=0)
        row = (blk.to(tl.int64) * PAGE + n % PAGE) * 576
        k0 = tl.load(KV + row[:, None] + d0[None, :], mask=nmask[:, None], other=0.0)
        k1 = tl.load(KV + row[:, None] + 256 + d0[None, :], mask=nmask[:, None], other=0.0)
        kp = tl.load(KV + row[:, None] + dp[None, :], mask=nmask[:, None], other=0.0)
        m_i, l_i, acc0, acc1 = _step(qn0, qn1, qp, k0, k1, kp, nmask, m_i, l_i, acc0, acc1,
                                     qk_scale)
    safe = tl.where(l_i > 0, l_i, 1.0)
    if ONE:
        ob = O + b.to(tl.int64) * sob + h[:, None] * soh
        tl.store(ob + d0[None, :], (acc0 / safe[:, None]).to(O.dtype.element_ty),
                 mask=hmask[:, None])
        tl.store(ob + 256 + d0[None, :], (acc1 / safe[:, None]).to(O.dtype.element_ty),
                 mask=hmask[:, None])
    else:
        lse = tl.where(l_i > 0, m_i + tl.log2(safe), -float("inf"))
        prow = (b.to(tl.int64) * H + h) * n_splits + s
        tl.store(Lp + prow, lse, mask=hmask)
        tl.store(Op + prow[:, None] * 512 + d0[None, :], acc0 / safe[:, None],
                 mask=hmask[:, None])
        tl.store(Op + prow[:, None] * 512 + 256 + d0[None, :], acc1 / safe[:, None],
                 mask=hmask[:, None])


@triton.jit(do_not_specialize=["n_splits"])  # one binary for any split count and table width
def _tma_merge(Op, Lp, O, H, n_splits, sob, soh, SPAD: tl.constexpr):
    bh = tl.program_id(0)
    b = bh // H
    h = bh % H
    base = bh.to(tl.int64) * n_splits
    sp = tl.arange(0, SPAD)
    lse = tl.load(Lp + base + sp, mask=sp < n_splits, other=-float("inf"))
    mx = tl.max(lse, axis=0)
    w = tl.where(lse > -float("inf"), tl.exp2(lse - mx), 0.0)
    w = w / tl.maximum(tl.sum(w, axis=0), 1e-30)
    d = tl.arange(0, 512)
    acc = tl.zeros([512], tl.float32)
    for i in range(0, n_splits):
        wi = tl.sum(tl.where(sp == i, w, 0.0), axis=0)
        acc += wi * tl.load(Op + (base + i) * 512 + d)
    tl.store(O + b.to(tl.int64) * sob + h * soh + d, acc.to(O.dtype.element_ty))


def forward(q, kv_cache, block_table, seq_lens, scale, *, BLOCK_H: int = 64, BLOCK_N: int = 64,
            GRID: int = 264, STAGES: int = 2, WS: int = 0, num_warps: int = 8):
    B, H = q.shape[0], q.shape[1]
    page = kv_cache.shape[1]
    cap = block_table.shape[1] * page
    hb = (H + BLOCK_H - 1) // BLOCK_H
    tiles = (cap + BLOCK_N - 1) // BLOCK_N
    want = max(1, min((GRID + B * hb - 1) // (B * hb), tiles))
    per = (tiles + want - 1) // want
    n_splits = (tiles + per - 1) // per
    out = torch.empty((B, H, 512), dtype=q.dtype, device=q.device)
    one = n_splits == 1
    rows = 1 if one else B * H * n_splits
    op = torch.empty((rows * 512,), dtype=torch.float32, device=q.device)
    lp = torch.empty((rows,), dtype=torch.float32, device=q.device)
    _tma_partial[(hb, n_splits, B)](
        q, kv_cache, block_table, seq_lens, out, op, lp, H, kv_cache.shape[0] * page, n_splits,
        per * BLOCK_N, scale * 1.4426950408889634, q.stride(0), q.stride(1),
        block_table.stride(0), out.stride(0), out.stride(1),
        PAGE=page, BLOCK_H=BLOCK_H, BLOCK_N=BLOCK_N, STAGES=STAGES, ONE=one,
        TMA=page % BLOCK_N == 0 and kv_cache.data_ptr() % 16 == 0,  # TMA needs aligned rows
        WS=bool(WS), num_warps=num_warps)
    if not one:
        spad = 1 << (n_splits - 1).bit_length()
        _tma_merge[(B * H,)](op, lp, out, H, n_splits, out.stride(0), out.stride(1),
                             SPAD=spad, num_warps=4)
    return out
