"""softmax over the last dim for long rows: one program per row, an online max/sum pass over
BLOCK-wide chunks, then a second pass that writes. Reads the row twice, writes it once."""
import torch
import triton
import triton.language as tl


@triton.jit
def _softmax_online(X, Y, n_cols, sx, sy, BLOCK: tl.constexpr, STAGES: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    m = tl.full([BLOCK], -float("inf"), tl.float32)
    s = tl.zeros([BLOCK], tl.float32)
    for c0 in tl.range(0, n_cols, BLOCK, num_stages=STAGES):
        c = c0 + cols
        x = tl.load(X + row * sx + c, mask=c < n_cols, other=-float("inf")).to(tl.float32)
        m_new = tl.maximum(m, x)
        # lanes that have seen only -inf keep s at 0 (avoid inf - inf)
        alpha = tl.where(m_new == -float("inf"), 0.0, tl.exp2((m - m_new) * 1.4426950408889634))
        p = tl.where(m_new == -float("inf"), 0.0, tl.exp2((x - m_new) * 1.4426950408889634))
        s = s * alpha + p
        m = m_new
    m_row = tl.max(m, axis=0)
    scale = tl.where(m == -float("inf"), 0.0, tl.exp2((m - m_row) * 1.4426950408889634))
    s_row = tl.sum(s * scale, axis=0)
    inv = 1.0 / s_row
    for c0 in tl.range(0, n_cols, BLOCK, num_stages=STAGES):
        c = c0 + cols
        x = tl.load(X + row * sx + c, mask=c < n_cols, other=-float("inf")).to(tl.float32)
        y = tl.exp2((x - m_row) * 1.4426950408889634) * inv
        tl.store(Y + row * sy + c, y.to(Y.dtype.element_ty), mask=c < n_cols)


def forward(x, *, BLOCK: int = 1024, STAGES: int = 2, num_warps: int = 4):
    n_cols = x.shape[-1]
    # contiguous x in as it is, y out in x's shape (see softmax/row.py)
    x2 = x if x.is_contiguous() else x.reshape(-1, n_cols)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    n_rows = x.numel() // n_cols
    sx = n_cols if x2 is x else x2.stride(0)
    y = torch.empty_like(x, memory_format=torch.contiguous_format)
    _softmax_online[(n_rows,)](x2, y, n_cols, sx, n_cols,
                               BLOCK=BLOCK, STAGES=STAGES, num_warps=num_warps)
    return y
