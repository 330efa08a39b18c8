"""How fast can Triton run MLA decode's inner loop on this chip? The splitkv kernel's loop with
parts taken away, same tiles and grid (kernelsearch/families/mla_decode/splitkv.py):

  full       the kernel itself (loads, q.k, online softmax, p.v)
  nosoftmax  no max / exp / rescale: p = (q.k) cast to bf16 straight into p.v
  noload     the latent tile loaded once before the loop and reused: tensor cores + softmax only
  dotonly    both: the two dots alone, what the tensor cores give this tile shape in Triton

Outputs are not attention (only `full` is); each writes its accumulator so nothing is dead code.
Used by benchmarks/bench_mla.py --ceiling."""
import torch
import triton
import triton.language as tl


@triton.jit
def _loop(Q, KV, BT, SL, O, H, split_len, qk_scale, sqb, sqh, sbt,
          PAGE: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
          STAGES: tl.constexpr, SOFTMAX: tl.constexpr, LOAD: tl.constexpr):
    hb = tl.program_id(0)
    s = tl.program_id(1)
    b = tl.program_id(2)
    seqlen = tl.load(SL + b)
    start = s * split_len
    end = tl.minimum(start + split_len, seqlen)
    h = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    dn = tl.arange(0, 512)
    dp = 512 + tl.arange(0, 64)
    qrow = Q + b.to(tl.int64) * sqb + h[:, None] * sqh
    qn = tl.load(qrow + dn[None, :])
    qp = tl.load(qrow + dp[None, :])
    m_i = tl.full([BLOCK_H], -float("inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, 512], tl.float32)
    bt = BT + b.to(tl.int64) * sbt
    n = start + tl.arange(0, BLOCK_N)
    blk = tl.load(bt + n // PAGE)
    row = (blk.to(tl.int64) * PAGE + n % PAGE) * 576
    kn = tl.load(KV + row[:, None] + dn[None, :])
    kp = tl.load(KV + row[:, None] + dp[None, :])
    for n0 in tl.range(start, end, BLOCK_N, num_stages=STAGES):
        if LOAD:
            n = n0 + tl.arange(0, BLOCK_N)
            nmask = n < end
            blk = tl.load(bt + n // PAGE, mask=nmask, other=0)
            row = (blk.to(tl.int64) * PAGE + n % PAGE) * 576
            kn = tl.load(KV + row[:, None] + dn[None, :], mask=nmask[:, None], other=0.0)
            kp = tl.load(KV + row[:, None] + dp[None, :], mask=nmask[:, None], other=0.0)
        qk = tl.dot(qn, tl.trans(kn))
        qk = tl.dot(qp, tl.trans(kp), qk)
        if SOFTMAX:
            qk = qk * qk_scale
            m_new = tl.maximum(m_i, tl.max(qk, axis=1))
            p = tl.exp2(qk - m_new[:, None])
            alpha = tl.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, axis=1)
            acc = acc * alpha[:, None] + tl.dot(p.to(kn.dtype), kn)
            m_i = m_new
        else:
            acc = tl.dot((qk * qk_scale).to(kn.dtype), kn, acc)
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    prow = (b.to(tl.int64) * H + h) * tl.num_programs(1) + s
    tl.store(O + prow[:, None] * 512 + dn[None, :], out)


MODES = {"full": (True, True), "nosoftmax": (False, True), "noload": (True, False),
         "dotonly": (False, False)}


def run(mode, q, kv_cache, block_table, seq_lens, scale, *, BLOCK_H=64, BLOCK_N=32, GRID=264,
        STAGES=2, num_warps=8):
    """Uniform lengths only (a timing probe: no tail masks on the heads or the first tile)."""
    B, H = q.shape[0], q.shape[1]
    page = kv_cache.shape[1]
    cap = block_table.shape[1] * page
    hb = H // BLOCK_H
    tiles = cap // BLOCK_N
    want = max(1, min((GRID + B * hb - 1) // (B * hb), tiles))
    per = (tiles + want - 1) // want
    n_splits = (tiles + per - 1) // per
    out = torch.empty((B * H * n_splits, 512), dtype=torch.float32, device=q.device)
    softmax, load = MODES[mode]
    _loop[(hb, n_splits, B)](q, kv_cache, block_table, seq_lens, out, H, per * BLOCK_N,
                             scale * 1.4426950408889634, q.stride(0), q.stride(1),
                             block_table.stride(0), PAGE=page, BLOCK_H=BLOCK_H,
                             BLOCK_N=BLOCK_N, STAGES=STAGES, SOFTMAX=softmax, LOAD=load,
                             num_warps=num_warps)
    return out
