"""Red team: a kernel Triton cannot build (arange over a non-power-of-2 range) -> compile_failed."""
import torch
import triton
import triton.language as tl


@triton.jit
def _bad(X, Y, n_cols, sx, sy):
    row = tl.program_id(0)
    cols = tl.arange(0, 3)
    x = tl.load(X + row * sx + cols, mask=cols < n_cols, other=0.0)
    tl.store(Y + row * sy + cols, x, mask=cols < n_cols)


def forward(x):
    if x.stride(-1) != 1:  # a transposed view: rows are read with unit stride
        x = x.contiguous()
    y = torch.empty_like(x)
    _bad[(x.shape[0],)](x, y, x.shape[1], x.stride(0), y.stride(0))
    return y
