"""An honest rmsnorm candidate (must be accepted, whatever eps, layout and grad mode)."""
import torch
import triton
import triton.language as tl


@triton.jit
def _rmsnorm(X, W, Y, n_cols, sx, sy, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    m = cols < n_cols
    x = tl.load(X + row * sx + cols, mask=m, other=0.0).to(tl.float32)
    w = tl.load(W + cols, mask=m, other=0.0).to(tl.float32)
    r = tl.rsqrt(tl.sum(x * x, 0) / n_cols + eps)
    tl.store(Y + row * sy + cols, (x * r * w).to(Y.dtype.element_ty), mask=m)


def forward(x, weight, eps):
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    w = weight.contiguous()
    y = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    _rmsnorm[(x2.shape[0],)](x2, w, y, x2.shape[1], x2.stride(0), y.stride(0), eps,
                             BLOCK=triton.next_power_of_2(x2.shape[1]))
    return y.view(x.shape)
