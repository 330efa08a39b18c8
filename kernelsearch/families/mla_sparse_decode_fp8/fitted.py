"""Sparse MLA decode over the V3.2 FP8 cache for the memory-bound head counts (16 / 32 heads a
GPU: DeepSeek-V3.2 at TP8 / TP4), one launch: each selected row read once, MMA tiles sized to
the heads.

Why: at 16 heads a 656-byte row feeds 16 query rows, about 30 FLOP a byte, so the time is the
bytes. `rows` spends three launches (positions -> rows, partials over (head block, split,
batch), merge) and a 64-row head block, 3/4 of every MMA tile wasted at 16 heads.

Schedule (mla_decode/fitted.py's, over the top-k instead of the context): every request has
the same ceil(topk / BLOCK_N) tiles of index slots, so the B * NT tiles of all requests laid end
to end are known on the host without a sync; GRID programs (over the head blocks) take the
contiguous runs [p T / P, (p + 1) T / P). Each tile maps its positions to physical rows inline
(indices + block_table; slots that are -1, at or past seq_len or off the cache are masked, so
nothing is fetched for them), loads the 512 e4m3 bytes, the 4 float32 scales and the 64 bf16
rope values through three dtype views of the same bytes (rows.py's), dequantizes in registers
and runs the two dots in q's dtype. A request one program covers is written directly; one
split over several writes one partial (output, log-sum-exp) per piece into slot b + p and bumps
its counter (acq_rel: publishes the piece, acquires the others'); the program that completes
it merges the pieces in slot order (bit-identical whoever completes it). A request with nothing
selected gets zeros, as the reference."""
import torch
import triton
import triton.language as tl


@triton.jit(do_not_specialize=["B", "P", "topk", "CAP", "NROWS", "sbt", "sib"])
def _fitted(Q, K8, KS, KR, BT, SL, IDX, O, Op, Lp, CNT, B, H, P, topk, CAP, NROWS, qk_scale,
            sqb, sqh, sbt, sib, sob, soh,
            PAGE: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
            STAGES: tl.constexpr):
    hb = tl.program_id(0)
    p = tl.program_id(1).to(tl.int64)
    n_hb = tl.num_programs(0)
    NT = (topk + BLOCK_N - 1) // BLOCK_N  # tiles a request: the same for every request
    T = NT * B.to(tl.int64)
    # fewer tiles than programs: the first T take one each (no program's run is empty, so
    # every program between a request's first and last tile holds a piece of it)
    PE = tl.minimum(T, P)
    t0 = tl.where(p < PE, (p * T) // tl.maximum(PE, 1), T)
    t1 = tl.where(p < PE, ((p + 1) * T) // tl.maximum(PE, 1), T)
    ntc = tl.maximum(NT, 1)
    b_lo = t0 // ntc
    b_hi = (t1 + ntc - 1) // ntc

    h = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    hmask = h < H
    dn = tl.arange(0, 512)
    dr = tl.arange(0, 64)
    dt = tl.arange(0, 4)
    for b in range(b_lo, b_hi):
        st_t = b * NT
        lo = tl.maximum(t0, st_t)
        hi = tl.minimum(t1, st_t + NT)
        seqlen = tl.minimum(tl.load(SL + b), CAP)
        qrow = Q + b * sqb + h[:, None] * sqh
        qn = tl.load(qrow + dn[None, :], mask=hmask[:, None], other=0.0)
        qp = tl.load(qrow + 512 + dr[None, :], mask=hmask[:, None], other=0.0)
        m_i = tl.full([BLOCK_H], -float("inf"), tl.float32)
        l_i = tl.zeros([BLOCK_H], tl.float32)
        acc = tl.zeros([BLOCK_H, 512], tl.float32)
        ib = IDX + b * sib
        bt = BT + b * sbt
        start = ((lo - st_t) * BLOCK_N).to(tl.int32)
        end = tl.minimum(((hi - st_t) * BLOCK_N).to(tl.int32), topk)
        for n0 in tl.range(start, end, BLOCK_N, num_stages=STAGES):
            n = n0 + tl.arange(0, BLOCK_N)
            # positions -> physical rows here (no rows kernel): skipped slots fetch nothing
            pos = tl.load(ib + n, mask=n < end, other=-1)
            ok = (pos >= 0) & (pos < seqlen)
            pos = tl.where(ok, pos, 0)
            blk = tl.load(bt + pos // PAGE, mask=ok, other=0)
            row = blk.to(tl.int64) * PAGE + pos % PAGE
            ok = ok & (row >= 0) & (row < NROWS)
            row = tl.where(ok, row, 0)
            raw = tl.load(K8 + row[:, None] * 656 + dn[None, :], mask=ok[:, None], other=0)
            sc = tl.load(KS + row[:, None] * 164 + 128 + dt[None, :], mask=ok[:, None],
                         other=0.0)
            f = tl.reshape(raw.to(tl.float8e4nv, bitcast=True).to(tl.float32),
                           [BLOCK_N, 4, 128])
            kn = tl.reshape(f * sc[:, :, None], [BLOCK_N, 512]).to(Q.dtype.element_ty)
            kp = tl.load(KR + row[:, None] * 328 + 264 + dr[None, :], mask=ok[:, None],
                         other=0.0).to(Q.dtype.element_ty)
            qk = tl.dot(qn, tl.trans(kn))
            qk = tl.dot(qp, tl.trans(kp), qk)
            qk = tl.where(ok[None, :], qk * qk_scale, -float("inf"))
            m_new = tl.maximum(m_i, tl.max(qk, axis=1))
            # a tile with nothing selected keeps m = -inf: exp2 of -inf, not of NaN
            m_use = tl.where(m_new > -float("inf"), m_new, 0.0)
            p_ij = tl.exp2(qk - m_use[:, None])
            alpha = tl.exp2(m_i - m_use)
            l_i = l_i * alpha + tl.sum(p_ij, axis=1)
            acc = acc * alpha[:, None] + tl.dot(p_ij.to(kn.dtype), kn)
            m_i = m_new
        safe = tl.where(l_i > 0, l_i, 1.0)  # nothing selected: acc is 0, the output zeros
        orow = O + b * sob + h[:, None] * soh + dn[None, :]
        # the programs holding this request's first and last tile
        first = ((st_t + 1) * PE - 1) // T
        last = ((st_t + NT) * PE - 1) // T
        if first == last:
            tl.store(orow, (acc / safe[:, None]).to(O.dtype.element_ty), mask=hmask[:, None])
        else:
            lse = tl.where(l_i > 0, m_i + tl.log2(safe), -float("inf"))
            # slot b + p is unique: along the tile order b + p only grows (B + P slots)
            prow = (b + p) * H + h
            tl.store(Lp + prow, lse, mask=hmask)
            tl.store(Op + prow[:, None] * 512 + dn[None, :], acc / safe[:, None],
                     mask=hmask[:, None])
            # release our piece, acquire the others': the last one in merges them all
            done = tl.atomic_add(CNT + b * n_hb + hb, 1, sem="acq_rel")
            if done == last - first:
                mx = tl.full([BLOCK_H], -float("inf"), tl.float32)
                for j in range(first, last + 1):
                    lj = tl.load(Lp + (b + j) * H + h, mask=hmask, other=-float("inf"),
                                 cache_modifier=".cg")
                    mx = tl.maximum(mx, lj)
                mx = tl.where(mx > -float("inf"), mx, 0.0)
                tot = tl.zeros([BLOCK_H], tl.float32)
                out = tl.zeros([BLOCK_H, 512], tl.float32)
                for j in range(first, last + 1):
                    r = (b + j) * H + h
                    lj = tl.load(Lp + r, mask=hmask, other=-float("inf"), cache_modifier=".cg")
                    w = tl.where(lj > -float("inf"), tl.exp2(lj - mx), 0.0)
                    tot += w
                    out += w[:, None] * tl.load(Op + r[:, None] * 512 + dn[None, :],
                                                mask=hmask[:, None], other=0.0,
                                                cache_modifier=".cg")
                out = out / tl.maximum(tot, 1e-30)[:, None]  # nothing selected: zeros
                tl.store(orow, out.to(O.dtype.element_ty), mask=hmask[:, None])
    if NT == 0:  # a top-k of width 0: no tiles, every request zeros (each by one program)
        for b in range(p, B, P):
            tl.store(O + b * sob + h[:, None] * soh + dn[None, :],
                     tl.zeros([BLOCK_H, 512], tl.float32).to(O.dtype.element_ty),
                     mask=hmask[:, None])


def forward(q, kv_cache, block_table, seq_lens, indices, scale, *, BLOCK_H: int = 16,
            BLOCK_N: int = 32, GRID: int = 132, STAGES: int = 2, num_warps: int = 4):
    """out [B, H, 512] for q [B, H, 576] over the uint8 [blocks, page, 656] cache."""
    B, H = q.shape[0], q.shape[1]
    page = kv_cache.shape[1]
    topk = indices.shape[1]
    hb = (H + BLOCK_H - 1) // BLOCK_H
    # programs a head block: GRID in all (the SMs, or a few waves), never more than the tiles
    P = max(1, min(GRID // hb, B * ((topk + BLOCK_N - 1) // BLOCK_N)))
    out = torch.empty((B, H, 512), dtype=q.dtype, device=q.device)
    op = torch.empty(((B + P) * H * 512,), dtype=torch.float32, device=q.device)
    lp = torch.empty(((B + P) * H,), dtype=torch.float32, device=q.device)
    cnt = torch.zeros((B * hb,), dtype=torch.int32, device=q.device)
    flat = kv_cache.reshape(-1, 656)  # rows of bytes: strides a dtype view takes (size-1 pages)
    _fitted[(hb, P)](
        q, flat, flat.view(torch.float32), flat.view(torch.bfloat16), block_table, seq_lens,
        indices, out, op, lp, cnt, B, H, P, topk, block_table.shape[1] * page,
        kv_cache.shape[0] * page, scale * 1.4426950408889634, q.stride(0), q.stride(1),
        block_table.stride(0), indices.stride(0), out.stride(0), out.stride(1),
        PAGE=page, BLOCK_H=BLOCK_H, BLOCK_N=BLOCK_N, STAGES=STAGES, num_warps=num_warps)
    return out
