"""Red team: reads a wild pointer; the child process dies (SIGSEGV) -> crashed."""
import torch
import triton
import triton.language as tl


@triton.jit
def _wild(X, Y, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(X + offs + 1099511627776)
    tl.store(Y + offs, x, mask=offs < n)


def forward(x):
    if x.stride(-1) != 1:  # a transposed view: rows are read with unit stride
        x = x.contiguous()
    y = torch.empty_like(x)
    _wild[(1,)](x, y, x.numel(), BLOCK=1024)
    return y
