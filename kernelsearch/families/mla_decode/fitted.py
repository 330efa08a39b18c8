"""MLA decode for the memory-bound cases (16-64 heads a GPU, one or two query tokens a step,
ragged batches): a split-KV schedule fit to the batch and its lengths, the combine fused.

Takes mla_decode's q [B, H, 576] and mla_decode_mtp's q [B, s_q, H, 576] (causal within the
step); rows m = token m // H, head m % H, so BLOCK_H = 32 packs both query tokens of 16 heads
into one 32-row MMA tile and each latent tile is read once for the whole step.

Schedule: GRID programs (over the head blocks) share the batch's tokens evenly. Every program
reads the lengths from device memory (no host sync: it replays in a CUDA graph), counts each
sequence's BLOCK_N-token tiles, and takes the contiguous run [p T / P, (p + 1) T / P) of the T
tiles of all sequences laid end to end: a ragged batch costs each program the same, however the
lengths fall. A sequence one program covers is written directly; a sequence split over several
writes one partial (output, log-sum-exp) per piece into slot b + p (unique: along the tile
order b + p only grows) and bumps the sequence's counter; the program that completes it merges
the pieces in slot order (deterministic, one launch). Empty sequences get zeros."""
import torch
import triton
import triton.language as tl


@triton.jit(do_not_specialize=["B", "P", "sbt", "CAP"])
def _fitted(Q, KV, BT, SL, O, Op, Lp, CNT, B, H, M, S_Q, P, CAP, qk_scale,
            sqb, sqs, sqh, sbt, sob, sos, soh,
            PAGE: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
            BPAD: tl.constexpr, STAGES: tl.constexpr):
    hb = tl.program_id(0)
    p = tl.program_id(1).to(tl.int64)
    n_hb = tl.num_programs(0)
    bi = tl.arange(0, BPAD)
    lens = tl.load(SL + bi, mask=bi < B, other=0)
    lens = tl.minimum(tl.maximum(lens, 0), CAP)
    tiles = (lens + BLOCK_N - 1) // BLOCK_N
    cum = tl.cumsum(tiles, axis=0).to(tl.int64)  # end tile of each sequence, exclusive
    T = tl.sum(tiles.to(tl.int64), axis=0)
    # fewer tiles than programs: the first T take one each (no program's run is empty, so
    # every program between a sequence's first and last holds a piece of it)
    PE = tl.minimum(T, P)
    t0 = tl.where(p < PE, (p * T) // tl.maximum(PE, 1), T)
    t1 = tl.where(p < PE, ((p + 1) * T) // tl.maximum(PE, 1), T)
    b_lo = tl.sum((cum <= t0).to(tl.int32), axis=0)
    b_hi = tl.sum((cum - tiles < t1).to(tl.int32), axis=0)

    m = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    mmask = m < M
    tok = m // H
    h = m % H
    dn = tl.arange(0, 512)
    dp = 512 + tl.arange(0, 64)
    for b in range(b_lo, b_hi):
        sel = bi == b
        end_t = tl.sum(tl.where(sel, cum, 0), axis=0)
        n_t = tl.sum(tl.where(sel, tiles, 0), axis=0)
        seqlen = tl.sum(tl.where(sel, lens, 0), axis=0)
        st_t = end_t - n_t
        lo = tl.maximum(t0, st_t)
        hi = tl.minimum(t1, end_t)
        if hi > lo:
            lim = seqlen - (S_Q - 1 - tok)  # causal within the step
            qrow = Q + b * sqb + tok[:, None] * sqs + h[:, None] * sqh
            qn = tl.load(qrow + dn[None, :], mask=mmask[:, None], other=0.0)
            qp = tl.load(qrow + dp[None, :], mask=mmask[:, None], other=0.0)
            m_i = tl.full([BLOCK_H], -float("inf"), tl.float32)
            l_i = tl.zeros([BLOCK_H], tl.float32)
            acc = tl.zeros([BLOCK_H, 512], tl.float32)
            bt = BT + b * sbt
            start = ((lo - st_t) * BLOCK_N).to(tl.int32)
            end = tl.minimum(((hi - st_t) * BLOCK_N).to(tl.int32), seqlen)
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
                # a row with nothing in this tile keeps m = -inf: exp2 of -inf, not of NaN
                m_use = tl.where(m_new > -float("inf"), m_new, 0.0)
                p_ij = tl.exp2(qk - m_use[:, None])
                alpha = tl.exp2(m_i - m_use)
                l_i = l_i * alpha + tl.sum(p_ij, axis=1)
                acc = acc * alpha[:, None] + tl.dot(p_ij.to(kn.dtype), kn)
                m_i = m_new
            safe = tl.where(l_i > 0, l_i, 1.0)
            orow = O + b * sob + tok[:, None] * sos + h[:, None] * soh + dn[None, :]
            # the programs holding this sequence's first and last tile
            first = ((st_t + 1) * PE - 1) // T
            last = (end_t * PE - 1) // T
            if first == last:
                tl.store(orow, (acc / safe[:, None]).to(O.dtype.element_ty), mask=mmask[:, None])
            else:
                lse = tl.where(l_i > 0, m_i + tl.log2(safe), -float("inf"))
                prow = (b + p) * M + m
                tl.store(Lp + prow, lse, mask=mmask)
                tl.store(Op + prow[:, None] * 512 + dn[None, :], acc / safe[:, None],
                         mask=mmask[:, None])
                # release our piece, acquire the others': the last one in merges them all
                done = tl.atomic_add(CNT + b * n_hb + hb, 1, sem="acq_rel")
                if done == last - first:
                    mx = tl.full([BLOCK_H], -float("inf"), tl.float32)
                    for j in range(first, last + 1):
                        lj = tl.load(Lp + (b + j) * M + m, mask=mmask, other=-float("inf"),
                                     cache_modifier=".cg")
                        mx = tl.maximum(mx, lj)
                    mx = tl.where(mx > -float("inf"), mx, 0.0)
                    tot = tl.zeros([BLOCK_H], tl.float32)
                    out = tl.zeros([BLOCK_H, 512], tl.float32)
                    for j in range(first, last + 1):
                        r = (b + j) * M + m
                        lj = tl.load(Lp + r, mask=mmask, other=-float("inf"), cache_modifier=".cg")
                        w = tl.where(lj > -float("inf"), tl.exp2(lj - mx), 0.0)
                        tot += w
                        out += w[:, None] * tl.load(Op + r[:, None] * 512 + dn[None, :],
                                                    mask=mmask[:, None], other=0.0,
                                                    cache_modifier=".cg")
                    out = out / tl.maximum(tot, 1e-30)[:, None]  # nothing attended: zeros
                    tl.store(orow, out.to(O.dtype.element_ty), mask=mmask[:, None])
    # sequences with no token: zeros (each written by one program)
    for b in range(p, B, P):
        if tl.sum(tl.where(bi == b, tiles, 0), axis=0) == 0:
            orow = O + b * sob + tok[:, None] * sos + h[:, None] * soh + dn[None, :]
            tl.store(orow, tl.zeros([BLOCK_H, 512], tl.float32).to(O.dtype.element_ty),
                     mask=mmask[:, None])


def forward(q, kv_cache, block_table, seq_lens, scale, *, BLOCK_H: int = 32, BLOCK_N: int = 32,
            GRID: int = 132, STAGES: int = 2, num_warps: int = 4):
    """out [B, H, 512] for q [B, H, 576]; [B, s_q, H, 512] for q [B, s_q, H, 576]."""
    mtp = q.dim() == 4
    B = q.shape[0]
    sq = q.shape[1] if mtp else 1
    H = q.shape[2] if mtp else q.shape[1]
    M = sq * H
    page = kv_cache.shape[1]
    cap = block_table.shape[1] * page
    hb = (M + BLOCK_H - 1) // BLOCK_H
    # programs a head block: GRID in all (the SMs, or a few waves of them), never more than
    # the tiles the capacity holds
    P = max(1, min(GRID // hb, B * ((cap + BLOCK_N - 1) // BLOCK_N)))
    out = torch.empty((B, sq, H, 512) if mtp else (B, H, 512), dtype=q.dtype, device=q.device)
    op = torch.empty(((B + P) * M * 512,), dtype=torch.float32, device=q.device)
    lp = torch.empty(((B + P) * M,), dtype=torch.float32, device=q.device)
    cnt = torch.zeros((B * hb,), dtype=torch.int32, device=q.device)
    if mtp:
        sqb, sqs, sqh = q.stride(0), q.stride(1), q.stride(2)
        sob, sos, soh = out.stride(0), out.stride(1), out.stride(2)
    else:
        sqb, sqs, sqh = q.stride(0), 0, q.stride(1)
        sob, sos, soh = out.stride(0), 0, out.stride(1)
    bpad = 1 << max(0, B - 1).bit_length()
    _fitted[(hb, P)](
        q, kv_cache, block_table, seq_lens, out, op, lp, cnt, B, H, M, sq, P, cap,
        scale * 1.4426950408889634, sqb, sqs, sqh, block_table.stride(0), sob, sos, soh,
        PAGE=page, BLOCK_H=BLOCK_H, BLOCK_N=BLOCK_N, BPAD=bpad, STAGES=STAGES,
        num_warps=num_warps)
    return out
