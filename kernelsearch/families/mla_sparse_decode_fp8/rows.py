"""Sparse MLA decode over the V3.2 FP8 cache, rows first: mla_sparse_decode's `rows` variant
(a first kernel turns positions into physical rows once), with each gathered row dequantized in
registers: 512 e4m3 bytes bitcast and widened, times their tile's float32 scale, and the 64 bf16
rope values, cast to q's dtype for the tensor-core dots. The cache goes in as three views of the
same bytes (uint8 for the e4m3 values, float32 for the scales, bfloat16 for the rope), so every
address is plain element arithmetic: 656 B a row = 164 float32 = 328 bfloat16."""
import torch
import triton
import triton.language as tl


@triton.jit(do_not_specialize=["sbt"])
def _rows(BT, SL, IDX, R, topk, cap, sbt, sib, PAGE: tl.constexpr, BLOCK: tl.constexpr):
    b = tl.program_id(0)
    n = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    seqlen = tl.minimum(tl.load(SL + b), cap)
    pos = tl.load(IDX + b.to(tl.int64) * sib + n, mask=n < topk, other=-1)
    ok = (pos >= 0) & (pos < seqlen)
    pos = tl.where(ok, pos, 0)
    blk = tl.load(BT + b.to(tl.int64) * sbt + pos // PAGE, mask=ok, other=0)
    tl.store(R + b.to(tl.int64) * topk + n, tl.where(ok, blk * PAGE + pos % PAGE, -1),
             mask=n < topk)


@triton.jit(do_not_specialize=["n_splits"])
def _fp8_partial(Q, K8, KS, KR, RW, O, Op, Lp, H, topk, n_splits, split_len, qk_scale, nrows,
                 sqb, sqh, sob, soh,
                 BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
                 STAGES: tl.constexpr, ONE: tl.constexpr):
    hb = tl.program_id(0)
    s = tl.program_id(1)
    b = tl.program_id(2)
    start = s * split_len
    end = tl.minimum(start + split_len, topk)
    h = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    hmask = h < H
    dn = tl.arange(0, 512)
    dr = tl.arange(0, 64)
    dt = tl.arange(0, 4)
    qrow = Q + b.to(tl.int64) * sqb + h[:, None] * sqh
    qn = tl.load(qrow + dn[None, :], mask=hmask[:, None], other=0.0)
    qp = tl.load(qrow + 512 + dr[None, :], mask=hmask[:, None], other=0.0)
    m_i = tl.full([BLOCK_H], -float("inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, 512], tl.float32)
    rb = RW + b.to(tl.int64) * topk
    for n0 in tl.range(start, end, BLOCK_N, num_stages=STAGES):
        n = n0 + tl.arange(0, BLOCK_N)
        r = tl.load(rb + n, mask=n < end, other=-1)
        ok = (r >= 0) & (r < nrows)
        row = tl.where(ok, r, 0).to(tl.int64)
        raw = tl.load(K8 + row[:, None] * 656 + dn[None, :], mask=ok[:, None], other=0)
        sc = tl.load(KS + row[:, None] * 164 + 128 + dt[None, :], mask=ok[:, None], other=0.0)
        f = tl.reshape(raw.to(tl.float8e4nv, bitcast=True).to(tl.float32), [BLOCK_N, 4, 128])
        kn = tl.reshape(f * sc[:, :, None], [BLOCK_N, 512]).to(Q.dtype.element_ty)
        kp = tl.load(KR + row[:, None] * 328 + 264 + dr[None, :], mask=ok[:, None],
                     other=0.0).to(Q.dtype.element_ty)
        qk = tl.dot(qn, tl.trans(kn))
        qk = tl.dot(qp, tl.trans(kp), qk)
        qk = tl.where(ok[None, :], qk * qk_scale, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(qk, axis=1))
        m_use = tl.where(m_new > -float("inf"), m_new, 0.0)
        p = tl.exp2(qk - m_use[:, None])
        alpha = tl.exp2(m_i - m_use)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(kn.dtype), kn)
        m_i = m_new
    safe = tl.where(l_i > 0, l_i, 1.0)
    if ONE:
        tl.store(O + b.to(tl.int64) * sob + h[:, None] * soh + dn[None, :],
                 (acc / safe[:, None]).to(O.dtype.element_ty), mask=hmask[:, None])
    else:
        lse = tl.where(l_i > 0, m_i + tl.log2(safe), -float("inf"))
        prow = (b.to(tl.int64) * H + h) * n_splits + s
        tl.store(Lp + prow, lse, mask=hmask)
        tl.store(Op + prow[:, None] * 512 + dn[None, :], acc / safe[:, None],
                 mask=hmask[:, None])


@triton.jit(do_not_specialize=["n_splits"])
def _fp8_merge(Op, Lp, O, H, n_splits, sob, soh, SPAD: tl.constexpr):
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


def forward(q, kv_cache, block_table, seq_lens, indices, scale, *, BLOCK_H: int = 64,
            BLOCK_N: int = 32, GRID: int = 264, STAGES: int = 2, num_warps: int = 8):
    B, H = q.shape[0], q.shape[1]
    page = kv_cache.shape[1]
    topk = indices.shape[1]
    hb = (H + BLOCK_H - 1) // BLOCK_H
    tiles = (topk + BLOCK_N - 1) // BLOCK_N
    want = max(1, min((GRID + B * hb - 1) // (B * hb), tiles))
    per = (tiles + want - 1) // want
    n_splits = (tiles + per - 1) // per
    out = torch.empty((B, H, 512), dtype=q.dtype, device=q.device)
    rows = torch.empty((B, topk), dtype=torch.int32, device=q.device)
    _rows[(B, (topk + 255) // 256)](block_table, seq_lens, indices, rows, topk,
                                    block_table.shape[1] * page, block_table.stride(0),
                                    indices.stride(0), PAGE=page, BLOCK=256, num_warps=4)
    one = n_splits == 1
    flat = kv_cache.reshape(-1, 656)  # rows of bytes: strides a dtype view takes (size-1 pages)
    nrow = 1 if one else B * H * n_splits
    op = torch.empty((nrow * 512,), dtype=torch.float32, device=q.device)
    lp = torch.empty((nrow,), dtype=torch.float32, device=q.device)
    _fp8_partial[(hb, n_splits, B)](
        q, flat, flat.view(torch.float32), flat.view(torch.bfloat16), rows, out, op,
        lp, H, topk, n_splits, per * BLOCK_N, scale * 1.4426950408889634,
        kv_cache.shape[0] * page, q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        BLOCK_H=BLOCK_H, BLOCK_N=BLOCK_N, STAGES=STAGES, ONE=one, num_warps=num_warps)
    if not one:
        spad = 1 << (n_splits - 1).bit_length()
        _fp8_merge[(B * H,)](op, lp, out, H, n_splits, out.stride(0), out.stride(1),
                             SPAD=spad, num_warps=4)
    return out
