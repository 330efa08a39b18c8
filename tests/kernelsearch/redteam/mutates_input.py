"""Red team: computes the softmax in place in its input buffer, then copies it out with a second
kernel -> incorrect/input_mutated."""
import torch
import triton
import triton.language as tl


@triton.jit
def _softmax_inplace(X, n_cols, sx, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(X + row * sx + cols, mask=cols < n_cols, other=-float("inf")).to(tl.float32)
    e = tl.exp(x - tl.max(x, 0))
    tl.store(X + row * sx + cols, (e / tl.sum(e, 0)).to(X.dtype.element_ty), mask=cols < n_cols)


@triton.jit
def _copy(X, Y, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(Y + offs, tl.load(X + offs, mask=offs < n), mask=offs < n)


def forward(x):
    _softmax_inplace[(x.shape[0],)](x, x.shape[1], x.stride(0),
                                    BLOCK=triton.next_power_of_2(x.shape[1]))
    y = torch.empty_like(x)
    _copy[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
    return y
