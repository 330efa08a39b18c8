"""Red team (issue 24): the shipped MLA split-KV kernel with the softmax scale fixed at the
family's default 1/sqrt(192), ignoring the argument: right only for that scale. The judge
draws the scale from the model presets (DeepSeek-V3 0.1352, tiny 1/sqrt(80), FlashMLA
1/sqrt(576)) and its range -> incorrect/tolerance."""
import torch
import triton
import triton.language as tl


@triton.jit(do_not_specialize=["n_splits", "sbt"])  # one binary for any split count and table width
def _mla_partial(Q, KV, BT, SL, O, Op, Lp, H, n_splits, split_len, qk_scale,
                 sqb, sqh, sbt, sob, soh,
                 PAGE: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
                 STAGES: tl.constexpr, ONE: tl.constexpr):
    hb = tl.program_id(0)
    s = tl.program_id(1)
    b = tl.program_id(2)
    seqlen = tl.load(SL + b)
    start = s * split_len
    end = tl.minimum(start + split_len, seqlen)
    h = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    hmask = h < H
    dn = tl.arange(0, 512)
    dp = 512 + tl.arange(0, 64)
    qrow = Q + b.to(tl.int64) * sqb + h[:, None] * sqh
    qn = tl.load(qrow + dn[None, :], mask=hmask[:, None], other=0.0)
    qp = tl.load(qrow + dp[None, :], mask=hmask[:, None], other=0.0)
    m_i = tl.full([BLOCK_H], -float("inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, 512], tl.float32)
    bt = BT + b.to(tl.int64) * sbt
    for n0 in tl.range(start, end, BLOCK_N, num_stages=STAGES):
        n = n0 + tl.arange(0, BLOCK_N)
        nmask = n < end
        blk = tl.load(bt + n // PAGE, mask=nmask, other=0)
        row = (blk.to(tl.int64) * PAGE + n % PAGE) * 576
        kn = tl.load(KV + row[:, None] + dn[None, :], mask=nmask[:, None], other=0.0)
        kp = tl.load(KV + row[:, None] + dp[None, :], mask=nmask[:, None], other=0.0)
        qk = tl.dot(qn, tl.trans(kn))
        qk = tl.dot(qp, tl.trans(kp), qk)
        qk = tl.where(nmask[None, :], qk * qk_scale, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(qk, axis=1))
        p = tl.exp2(qk - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(kn.dtype), kn)
        m_i = m_new
    if ONE:
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(O + b.to(tl.int64) * sob + h[:, None] * soh + dn[None, :],
                 out.to(O.dtype.element_ty), mask=hmask[:, None])
    else:
        # an empty chunk (past this sequence's length) leaves l = 0, lse = -inf: the merge
        # gives it weight 0
        safe = tl.where(l_i > 0, l_i, 1.0)
        lse = tl.where(l_i > 0, m_i + tl.log2(safe), -float("inf"))
        prow = (b.to(tl.int64) * H + h) * n_splits + s
        tl.store(Lp + prow, lse, mask=hmask)
        tl.store(Op + prow[:, None] * 512 + dn[None, :], acc / safe[:, None],
                 mask=hmask[:, None])


@triton.jit(do_not_specialize=["n_splits"])  # one binary for any split count and table width
def _mla_merge(Op, Lp, O, H, n_splits, sob, soh, SPAD: tl.constexpr):
    bh = tl.program_id(0)
    b = bh // H
    h = bh % H
    base = bh.to(tl.int64) * n_splits
    sp = tl.arange(0, SPAD)
    lse = tl.load(Lp + base + sp, mask=sp < n_splits, other=-float("inf"))
    mx = tl.max(lse, axis=0)
    w = tl.where(lse > -float("inf"), tl.exp2(lse - mx), 0.0)
    w = w / tl.maximum(tl.sum(w, axis=0), 1e-30)  # no token at all: zeros, as the reference
    d = tl.arange(0, 512)
    acc = tl.zeros([512], tl.float32)
    for i in range(0, n_splits):
        wi = tl.sum(tl.where(sp == i, w, 0.0), axis=0)
        acc += wi * tl.load(Op + (base + i) * 512 + d)
    tl.store(O + b.to(tl.int64) * sob + h * soh + d, acc.to(O.dtype.element_ty))


def forward(q, kv_cache, block_table, seq_lens, scale, *, BLOCK_H: int = 64, BLOCK_N: int = 32,
            GRID: int = 264, STAGES: int = 2, num_warps: int = 8):
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
    _mla_partial[(hb, n_splits, B)](
        q, kv_cache, block_table, seq_lens, out, op, lp, H, n_splits, per * BLOCK_N,
        0.07216878364870323 * 1.4426950408889634, q.stride(0), q.stride(1), block_table.stride(0),
        out.stride(0), out.stride(1),
        PAGE=page, BLOCK_H=BLOCK_H, BLOCK_N=BLOCK_N, STAGES=STAGES, ONE=one,
        num_warps=num_warps)
    if not one:
        spad = 1 << (n_splits - 1).bit_length()
        _mla_merge[(B * H,)](op, lp, out, H, n_splits, out.stride(0), out.stride(1),
                             SPAD=spad, num_warps=4)
    return out
