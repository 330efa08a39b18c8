"""softmax for long rows, built for the bandwidth limit: one program per row, two passes over
BLOCK-wide chunks. The first keeps one running max for the row (a chunk reduction, so its
rescale is one exponential per chunk, not per element) and loads with evict_last, so the row is
still in L2 for the second pass, which streams it out with evict_first and writes. Two
exponentials per element in all (the per-lane online variant needs three: at 4 TB/s that is near
the special-function units' rate)."""
import torch
import triton
import triton.language as tl


@triton.jit
def _softmax_streamed(X, Y, n_cols, sx, sy, BLOCK: tl.constexpr, STAGES: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    LOG2E: tl.constexpr = 1.4426950408889634
    m = tl.max(tl.full([BLOCK], -float("inf"), tl.float32), axis=0)  # an fp32 scalar tensor
    s = tl.zeros([BLOCK], tl.float32)
    for c0 in tl.range(0, n_cols, BLOCK, num_stages=STAGES):
        c = c0 + cols
        x = tl.load(X + row * sx + c, mask=c < n_cols, other=-float("inf"),
                    eviction_policy="evict_last").to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, axis=0))
        # a row of -inf so far keeps s at 0 (no inf - inf)
        alpha = tl.where(m_new == -float("inf"), 0.0, tl.exp2((m - m_new) * LOG2E))
        p = tl.where(m_new == -float("inf"), 0.0, tl.exp2((x - m_new) * LOG2E))
        s = s * alpha + p
        m = m_new
    inv = 1.0 / tl.sum(s, axis=0)
    for c0 in tl.range(0, n_cols, BLOCK, num_stages=STAGES):
        c = c0 + cols
        x = tl.load(X + row * sx + c, mask=c < n_cols, other=-float("inf"),
                    eviction_policy="evict_first").to(tl.float32)
        y = tl.exp2((x - m) * LOG2E) * inv
        tl.store(Y + row * sy + c, y.to(Y.dtype.element_ty), mask=c < n_cols)


def forward(x, *, BLOCK: int = 2048, STAGES: int = 1, num_warps: int = 8):
    n_cols = x.shape[-1]
    # contiguous x in as it is, y out in x's shape (see softmax/row.py)
    x2 = x if x.is_contiguous() else x.reshape(-1, n_cols)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    n_rows = x.numel() // n_cols
    sx = n_cols if x2 is x else x2.stride(0)
    y = torch.empty_like(x, memory_format=torch.contiguous_format)
    _softmax_streamed[(n_rows,)](x2, y, n_cols, sx, n_cols,
                                 BLOCK=BLOCK, STAGES=STAGES, num_warps=num_warps)
    return y
