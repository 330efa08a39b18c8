"""Red team (issue 24): assumes rows of exactly n_cols elements (a contiguous input): right on
fresh tensors, wrong on a slice of a wider one, which dispatch hands to it ->
incorrect/tolerance (the judge's row-strided and transposed views)."""
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
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    n = x.shape[-1]
    _softmax[(x.numel() // n,)](x, y, n, n, n, BLOCK=triton.next_power_of_2(n))
    return y
