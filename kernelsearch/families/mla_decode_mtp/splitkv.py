"""MLA decode with s_q query tokens a step, split-KV: mla_decode's splitkv over the step's
s_q * H query rows (row m = token m // H, head m % H), BLOCK_H rows sharing each [BLOCK_N, 576]
latent tile in one tl.dot; each row's causal limit (token j: seq_len - (s_q - 1 - j) positions)
masks its own scores, so one program reads each tile once for both tokens when BLOCK_H spans
them. Chunks merged by log-sum-exp; a row with nothing to attend gives 0."""
import torch
import triton
import triton.language as tl


@triton.jit(do_not_specialize=["n_splits", "sbt"])
def _mtp_partial(Q, KV, BT, SL, O, Op, Lp, H, M, S_Q, n_splits, split_len, qk_scale,
                 sqb, sqs, sqh, sbt, sob, sos, soh,
                 PAGE: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
                 STAGES: tl.constexpr, ONE: tl.constexpr):
    hb = tl.program_id(0)
    s = tl.program_id(1)
    b = tl.program_id(2)
    seqlen = tl.load(SL + b)
    start = s * split_len
    end = tl.minimum(start + split_len, seqlen)
    m = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    mmask = m < M
    tok = m // H
    h = m % H
    lim = seqlen - (S_Q - 1 - tok)  # causal within the step: token j sees this many positions
    dn = tl.arange(0, 512)
    dp = 512 + tl.arange(0, 64)
    qrow = Q + b.to(tl.int64) * sqb + tok[:, None] * sqs + h[:, None] * sqh
    qn = tl.load(qrow + dn[None, :], mask=mmask[:, None], other=0.0)
    qp = tl.load(qrow + dp[None, :], mask=mmask[:, None], other=0.0)
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
        ok = nmask[None, :] & (n[None, :] < lim[:, None])
        qk = tl.where(ok, qk * qk_scale, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(qk, axis=1))
        # a row with nothing in this tile (its causal limit) keeps m = -inf: exp2 of -inf, not NaN
        m_use = tl.where(m_new > -float("inf"), m_new, 0.0)
        p = tl.exp2(qk - m_use[:, None])
        alpha = tl.exp2(m_i - m_use)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(kn.dtype), kn)
        m_i = m_new
    safe = tl.where(l_i > 0, l_i, 1.0)
    if ONE:
        tl.store(O + b.to(tl.int64) * sob + tok[:, None] * sos + h[:, None] * soh + dn[None, :],
                 (acc / safe[:, None]).to(O.dtype.element_ty), mask=mmask[:, None])
    else:
        lse = tl.where(l_i > 0, m_i + tl.log2(safe), -float("inf"))
        prow = (b.to(tl.int64) * M + m) * n_splits + s
        tl.store(Lp + prow, lse, mask=mmask)
        tl.store(Op + prow[:, None] * 512 + dn[None, :], acc / safe[:, None],
                 mask=mmask[:, None])


@triton.jit(do_not_specialize=["n_splits"])
def _mtp_merge(Op, Lp, O, H, M, n_splits, sob, sos, soh, SPAD: tl.constexpr):
    bm = tl.program_id(0)
    b = bm // M
    m = bm % M
    base = bm.to(tl.int64) * n_splits
    sp = tl.arange(0, SPAD)
    lse = tl.load(Lp + base + sp, mask=sp < n_splits, other=-float("inf"))
    mx = tl.max(lse, axis=0)
    w = tl.where(lse > -float("inf"), tl.exp2(lse - mx), 0.0)
    w = w / tl.maximum(tl.sum(w, axis=0), 1e-30)  # nothing attended: zeros, as the reference
    d = tl.arange(0, 512)
    acc = tl.zeros([512], tl.float32)
    for i in range(0, n_splits):
        wi = tl.sum(tl.where(sp == i, w, 0.0), axis=0)
        acc += wi * tl.load(Op + (base + i) * 512 + d)
    tl.store(O + b.to(tl.int64) * sob + (m // H) * sos + (m % H) * soh + d,
             acc.to(O.dtype.element_ty))


def forward(q, kv_cache, block_table, seq_lens, scale, *, BLOCK_H: int = 64, BLOCK_N: int = 32,
            GRID: int = 264, STAGES: int = 2, num_warps: int = 8):
    B, sq, H = q.shape[0], q.shape[1], q.shape[2]
    M = sq * H
    page = kv_cache.shape[1]
    cap = block_table.shape[1] * page
    hb = (M + BLOCK_H - 1) // BLOCK_H
    tiles = (cap + BLOCK_N - 1) // BLOCK_N
    want = max(1, min((GRID + B * hb - 1) // (B * hb), tiles))
    per = (tiles + want - 1) // want
    n_splits = (tiles + per - 1) // per
    out = torch.empty((B, sq, H, 512), dtype=q.dtype, device=q.device)
    one = n_splits == 1
    rows = 1 if one else B * M * n_splits
    op = torch.empty((rows * 512,), dtype=torch.float32, device=q.device)
    lp = torch.empty((rows,), dtype=torch.float32, device=q.device)
    _mtp_partial[(hb, n_splits, B)](
        q, kv_cache, block_table, seq_lens, out, op, lp, H, M, sq, n_splits, per * BLOCK_N,
        scale * 1.4426950408889634, q.stride(0), q.stride(1), q.stride(2),
        block_table.stride(0), out.stride(0), out.stride(1), out.stride(2),
        PAGE=page, BLOCK_H=BLOCK_H, BLOCK_N=BLOCK_N, STAGES=STAGES, ONE=one,
        num_warps=num_warps)
    if not one:
        spad = 1 << (n_splits - 1).bit_length()
        _mtp_merge[(B * M,)](op, lp, out, H, M, n_splits, out.stride(0), out.stride(1),
                             out.stride(2), SPAD=spad, num_warps=4)
    return out
