"""Decode attention, flash-decoding style: the KV length is split into chunks of SPLIT tokens;
each program takes one (batch, kv head, chunk) and all GROUP query heads that share the kv head
(GQA), so K/V are read once. A second kernel merges the chunks' (max, sum, acc) partials."""
import torch
import triton
import triton.language as tl


@triton.jit
def _fd_partial(Q, K, V, Mo, Lo, Ao, L, HKV, n_splits, split_len, qk_scale,
                sqb, sqh, skb, skh, skl, svb, svh, svl,
                GROUP: tl.constexpr, GPAD: tl.constexpr, D: tl.constexpr,
                BLOCK_N: tl.constexpr, STAGES: tl.constexpr):
    bh = tl.program_id(0)
    s = tl.program_id(1)
    b = bh // HKV
    kh = bh % HKV
    g = tl.arange(0, GPAD)
    d = tl.arange(0, D)
    gmask = g < GROUP
    heads = kh * GROUP + g
    q = tl.load(Q + b * sqb + heads[:, None] * sqh + d[None, :], mask=gmask[:, None], other=0.0)
    start = s * split_len
    end = tl.minimum(start + split_len, L)
    k_base = K + b.to(tl.int64) * skb + kh.to(tl.int64) * skh
    v_base = V + b.to(tl.int64) * svb + kh.to(tl.int64) * svh
    m_i = tl.full([GPAD], -float("inf"), tl.float32)
    l_i = tl.zeros([GPAD], tl.float32)
    acc = tl.zeros([GPAD, D], tl.float32)
    for n0 in tl.range(start, end, BLOCK_N, num_stages=STAGES):
        n = n0 + tl.arange(0, BLOCK_N)
        nmask = n < end
        k = tl.load(k_base + n.to(tl.int64)[:, None] * skl + d[None, :], mask=nmask[:, None],
                    other=0.0)
        qk = tl.dot(q, tl.trans(k)) * qk_scale
        qk = tl.where(nmask[None, :], qk, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(qk, axis=1))
        p = tl.exp2(qk - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_base + n.to(tl.int64)[:, None] * svl + d[None, :], mask=nmask[:, None],
                    other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    row = (b * HKV * GROUP + heads).to(tl.int64) * n_splits + s
    tl.store(Mo + row, m_i, mask=gmask)
    tl.store(Lo + row, l_i, mask=gmask)
    tl.store(Ao + row[:, None] * D + d[None, :], acc, mask=gmask[:, None])


@triton.jit
def _fd_merge(Mo, Lo, Ao, O, n_splits, HQ, sob, soh, D: tl.constexpr):
    bh = tl.program_id(0)
    b = bh // HQ
    h = bh % HQ
    d = tl.arange(0, D)
    base = bh.to(tl.int64) * n_splits
    m = tl.full([1], -float("inf"), tl.float32)
    l = tl.zeros([1], tl.float32)
    acc = tl.zeros([D], tl.float32)
    for s in range(0, n_splits):
        ms = tl.load(Mo + base + s + tl.zeros([1], tl.int32))
        ls = tl.load(Lo + base + s + tl.zeros([1], tl.int32))
        a = tl.load(Ao + (base + s) * D + d)
        m_new = tl.maximum(m, ms)
        alpha = tl.exp2(m - m_new)
        beta = tl.exp2(ms - m_new)
        l = l * alpha + ls * beta
        acc = acc * alpha + a * beta
        m = m_new
    out = acc / l
    tl.store(O + b * sob + h * soh + d, out.to(O.dtype.element_ty))


def forward(q, k, v, *, BLOCK_N: int = 64, SPLIT: int = 512, STAGES: int = 2,
            num_warps: int = 4):
    B, HQ, D = q.shape
    HKV = k.shape[1]
    L = k.shape[2]
    group = HQ // HKV
    gpad = max(16, 1 << (group - 1).bit_length())  # plain ints: triton's helpers cost us per call
    n_splits = (L + SPLIT - 1) // SPLIT
    mo = torch.empty((B * HQ * n_splits,), dtype=torch.float32, device=q.device)
    lo = torch.empty((B * HQ * n_splits,), dtype=torch.float32, device=q.device)
    ao = torch.empty((B * HQ * n_splits * D,), dtype=torch.float32, device=q.device)
    out = torch.empty((B, HQ, D), dtype=q.dtype, device=q.device)
    qk_scale = 1.4426950408889634 / (D ** 0.5)
    _fd_partial[(B * HKV, n_splits)](
        q, k, v, mo, lo, ao, L, HKV, n_splits, SPLIT, qk_scale,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        GROUP=group, GPAD=gpad, D=D, BLOCK_N=BLOCK_N, STAGES=STAGES, num_warps=num_warps)
    _fd_merge[(B * HQ,)](mo, lo, ao, out, n_splits, HQ, out.stride(0), out.stride(1), D=D,
                         num_warps=1)
    return out
