"""Red team: computes the softmax in bf16 whatever the input dtype -> incorrect/tolerance (fp32)."""
import torch
import triton
import triton.language as tl


@triton.jit
def _softmax_bf16(X, Y, n_cols, sx, sy, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(X + row * sx + cols, mask=cols < n_cols, other=-float("inf")).to(tl.bfloat16)
    e = tl.exp((x - tl.max(x, 0)).to(tl.float32)).to(tl.bfloat16)
    s = tl.sum(e.to(tl.float32), 0).to(tl.bfloat16)
    tl.store(Y + row * sy + cols, (e / s).to(Y.dtype.element_ty), mask=cols < n_cols)


def forward(x):
    if x.stride(-1) != 1:  # a transposed view: rows are read with unit stride
        x = x.contiguous()
    y = torch.empty_like(x)
    _softmax_bf16[(x.shape[0],)](x, y, x.shape[1], x.stride(0), y.stride(0),
                                 BLOCK=triton.next_power_of_2(x.shape[1]))
    return y
