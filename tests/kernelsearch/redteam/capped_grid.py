"""Red team: caps its grid at 256 programs, one row each and no loop over the rest (a grid sized
for the shapes it was tried on) -> incorrect/unwritten at the boundary shape of 257 rows."""
import torch
import triton
import triton.language as tl


@triton.jit
def _softmax(X, Y, n_cols, sx, sy, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    x = tl.load(X + row * sx + cols, mask=cols < n_cols, other=-float("inf")).to(tl.float32)
    e = tl.exp(x - tl.max(x, 0))
    tl.store(Y + row * sy + cols, (e / tl.sum(e, 0)).to(Y.dtype.element_ty), mask=cols < n_cols)


def forward(x):
    if x.stride(-1) != 1:  # a transposed view: rows are read with unit stride
        x = x.contiguous()
    y = torch.empty_like(x)
    grid = (max(1, min(x.shape[0], 256)),)
    _softmax[grid](x, y, x.shape[1], x.stride(0), y.stride(0),
                   BLOCK=min(triton.next_power_of_2(x.shape[1]), 32768))
    return y
