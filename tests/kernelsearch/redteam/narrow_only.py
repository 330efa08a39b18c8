"""Red team: correct only below a width: normalises over the first 2048 columns and writes zeros
past them. The CPU's random shapes reach 2500 columns only by chance -> incorrect/tolerance at
the boundary shape of 2049 columns, every run."""
import torch
import triton
import triton.language as tl


@triton.jit
def _softmax_narrow(X, Y, n_cols, sx, sy, BLOCK: tl.constexpr, WIDE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    x = tl.load(X + row * sx + cols, mask=cols < n_cols, other=-float("inf")).to(tl.float32)
    e = tl.exp(x - tl.max(x, 0))
    tl.store(Y + row * sy + cols, (e / tl.sum(e, 0)).to(Y.dtype.element_ty), mask=cols < n_cols)
    for start in range(BLOCK, WIDE, BLOCK):
        rest = start + cols
        tl.store(Y + row * sy + rest, tl.zeros([BLOCK], tl.float32).to(Y.dtype.element_ty),
                 mask=rest < n_cols)


def forward(x):
    if x.stride(-1) != 1:  # a transposed view: rows are read with unit stride
        x = x.contiguous()
    y = torch.empty_like(x)
    block = min(triton.next_power_of_2(x.shape[1]), 2048)
    _softmax_narrow[(x.shape[0],)](x, y, x.shape[1], x.stride(0), y.stride(0), BLOCK=block,
                                   WIDE=triton.next_power_of_2(x.shape[1]))
    return y
