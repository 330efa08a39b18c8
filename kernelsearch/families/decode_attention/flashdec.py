"""Decode attention, flash-decoding with a one-pass merge. Same split of the KV length as
`splitkv` (chunks of SPLIT tokens; a program per (batch, kv head, chunk) holding all GROUP query
heads of that kv head, so K/V are read once), but the merge reads every chunk's (max, sum, acc)
partials in one vectorised load instead of a loop with one memory round trip per chunk: many
splits (small SPLIT, enough programs to fill the GPU at short contexts and batch 1) no longer cost
a serial merge.

Over a preallocated (static) cache, `lens` (int32 [B]: filled positions per sequence) and `valid`
(bool [B or 1, L]: the attention mask's row, e.g. left padding) come from device memory, so one
launch shape serves every decode step (a CUDA graph replays it as the cache fills): programs past
a sequence's length read nothing, and masked positions weigh zero."""
import torch
import triton
import triton.language as tl


@triton.jit
def _fd_partial(Q, K, V, Mo, Lo, Ao, L, HKV, n_splits, split_len, qk_scale,
                sqb, sqh, skb, skh, skl, svb, svh, svl, Lens, Valid, svalb,
                GROUP: tl.constexpr, GPAD: tl.constexpr, D: tl.constexpr,
                BLOCK_N: tl.constexpr, STAGES: tl.constexpr, HAS_LENS: tl.constexpr,
                HAS_VALID: tl.constexpr):
    bh = tl.program_id(0)
    s = tl.program_id(1)
    b = bh // HKV
    kh = bh % HKV
    if HAS_LENS:
        L = tl.minimum(tl.load(Lens + b), L)
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
        v = tl.load(v_base + n.to(tl.int64)[:, None] * svl + d[None, :], mask=nmask[:, None],
                    other=0.0)
        qk = tl.dot(q, tl.trans(k)) * qk_scale
        if HAS_VALID:
            ok = tl.load(Valid + b.to(tl.int64) * svalb + n, mask=nmask, other=0) != 0
            qk = tl.where((nmask & ok)[None, :], qk, -float("inf"))
            m_new = tl.maximum(m_i, tl.max(qk, axis=1))
            m_new = tl.where(m_new == -float("inf"), 0.0, m_new)  # a wholly masked block
        else:
            qk = tl.where(nmask[None, :], qk, -float("inf"))
            m_new = tl.maximum(m_i, tl.max(qk, axis=1))
        p = tl.exp2(qk - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    row = (b * HKV * GROUP + heads).to(tl.int64) * n_splits + s
    tl.store(Mo + row, m_i, mask=gmask)
    tl.store(Lo + row, l_i, mask=gmask)
    tl.store(Ao + row[:, None] * D + d[None, :], acc, mask=gmask[:, None])


@triton.jit
def _fd_merge(Mo, Lo, Ao, O, n_splits, HQ, sob, soh, D: tl.constexpr, SPAD: tl.constexpr):
    bh = tl.program_id(0)
    b = bh // HQ
    h = bh % HQ
    d = tl.arange(0, D)
    sp = tl.arange(0, SPAD)
    smask = sp < n_splits
    rows = bh.to(tl.int64) * n_splits + sp
    ms = tl.load(Mo + rows, mask=smask, other=-float("inf"))
    ls = tl.load(Lo + rows, mask=smask, other=0.0)
    a = tl.load(Ao + rows[:, None] * D + d[None, :], mask=smask[:, None], other=0.0)
    m = tl.max(ms, axis=0)
    w = tl.exp2(ms - m)  # padded chunks: exp2(-inf) = 0
    l = tl.sum(ls * w, axis=0)
    out = tl.sum(a * w[:, None], axis=0) / l
    tl.store(O + b * sob + h * soh + d, out.to(O.dtype.element_ty))


def forward(q, k, v, lens=None, valid=None, *, BLOCK_N: int = 64, SPLIT: int = 256,
            STAGES: int = 2, num_warps: int = 4):
    B, HQ, D = q.shape
    HKV = k.shape[1]
    L = k.shape[2]
    group = HQ // HKV
    gpad = max(16, 1 << (group - 1).bit_length())  # plain ints: triton's helpers cost us per call
    n_splits = (L + SPLIT - 1) // SPLIT
    spad = max(2, 1 << (n_splits - 1).bit_length())
    mo = torch.empty((B * HQ * n_splits,), dtype=torch.float32, device=q.device)
    lo = torch.empty((B * HQ * n_splits,), dtype=torch.float32, device=q.device)
    ao = torch.empty((B * HQ * n_splits * D,), dtype=torch.float32, device=q.device)
    out = torch.empty((B, HQ, D), dtype=q.dtype, device=q.device)
    qk_scale = 1.4426950408889634 / (D ** 0.5)
    _fd_partial[(B * HKV, n_splits)](
        q, k, v, mo, lo, ao, L, HKV, n_splits, SPLIT, qk_scale,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        q if lens is None else lens, q if valid is None else valid,
        0 if valid is None or valid.shape[0] == 1 else valid.stride(0),
        GROUP=group, GPAD=gpad, D=D, BLOCK_N=BLOCK_N, STAGES=STAGES, HAS_LENS=lens is not None,
        HAS_VALID=valid is not None, num_warps=num_warps)
    _fd_merge[(B * HQ,)](mo, lo, ao, out, n_splits, HQ, out.stride(0), out.stride(1), D=D,
                         SPAD=spad, num_warps=4 if spad * D >= 4096 else 2)
    return out
