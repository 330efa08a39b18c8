"""swiglu on a 2-D grid: (row block, column block) tiles, for strided rows (e.g. a fused
gate|up projection output split into two views)."""
import torch
import triton
import triton.language as tl


@triton.jit
def _swiglu_rows(G, U, Y, n_rows, n_cols, sg, su, sy,
                 BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    rows = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
    g = tl.load(G + rows[:, None] * sg + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    u = tl.load(U + rows[:, None] * su + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    y = g / (1.0 + tl.exp2(-g * 1.4426950408889634)) * u
    tl.store(Y + rows[:, None] * sy + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)


def forward(gate, up, *, BLOCK_R: int = 1, BLOCK_C: int = 1024, num_warps: int = 4):
    n_cols = gate.shape[-1]
    # contiguous inputs go in as they are, y comes out in gate's shape (see softmax/row.py)
    g = gate if gate.is_contiguous() else gate.reshape(-1, n_cols)
    u = up if up.is_contiguous() else up.reshape(-1, n_cols)
    if g.stride(-1) != 1:
        g = g.contiguous()
    if u.stride(-1) != 1:
        u = u.contiguous()
    n_rows = gate.numel() // n_cols
    y = torch.empty_like(gate, memory_format=torch.contiguous_format)
    grid = ((n_rows + BLOCK_R - 1) // BLOCK_R, (n_cols + BLOCK_C - 1) // BLOCK_C)
    _swiglu_rows[grid](g, u, y, n_rows, n_cols, n_cols if g is gate else g.stride(0),
                       n_cols if u is up else u.stride(0), n_cols,
                       BLOCK_R=BLOCK_R, BLOCK_C=BLOCK_C, num_warps=num_warps)
    return y
