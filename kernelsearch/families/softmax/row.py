"""softmax over the last dim: a [ROWS, BLOCK] tile per program holds whole rows in registers."""
import torch
import triton
import triton.language as tl


@triton.jit
def _softmax_rows(X, Y, n_rows, n_cols, sx, sy,
                  BLOCK: tl.constexpr, ROWS: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    rmask = rows < n_rows
    mask = rmask[:, None] & (cols[None, :] < n_cols)
    rows64 = rows.to(tl.int64)
    x = tl.load(X + rows64[:, None] * sx + cols[None, :], mask=mask, other=-float("inf"))
    x = x.to(tl.float32)
    m = tl.max(x, axis=1)
    e = tl.exp2((x - m[:, None]) * 1.4426950408889634)
    s = tl.sum(e, axis=1)
    y = e / s[:, None]
    tl.store(Y + rows64[:, None] * sy + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)


def forward(x, *, ROWS: int = 1, num_warps: int = 4):
    n_cols = x.shape[-1]
    # a contiguous x goes in as it is and y comes out in x's shape: reshape and view cost host
    # time on every call (tens of us per eager call with the launch, which ATen's ops don't pay)
    x2 = x if x.is_contiguous() else x.reshape(-1, n_cols)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    n_rows = x.numel() // n_cols
    sx = n_cols if x2 is x else x2.stride(0)
    y = torch.empty_like(x, memory_format=torch.contiguous_format)
    BLOCK = 1 << (n_cols - 1).bit_length()  # next power of 2 (triton's helper costs us per call)
    grid = ((n_rows + ROWS - 1) // ROWS,)
    _softmax_rows[grid](x2, y, n_rows, n_cols, sx, n_cols,
                        BLOCK=BLOCK, ROWS=ROWS, num_warps=num_warps)
    return y
