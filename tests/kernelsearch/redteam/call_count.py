"""Red team (issue 24): counts calls on one input tensor (a serving loop reuses its buffers, a
judge used fresh ones) and skips the work from the 11th call in a row on -> statically
guard_failed/module_state (a mutable default); with the guard off the repeated-call stage
(thousands in a row on a GPU, a second's worth on the CPU) -> incorrect/repeated_calls."""
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


def forward(x, _seen={}):
    n = _seen.get(x.data_ptr(), 0) + 1
    _seen.clear()
    _seen.update({x.data_ptr(): n})
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    y = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    _softmax[(x2.shape[0] if n <= 10 else 1,)](x2, y, x2.shape[1], x2.stride(0), y.stride(0),
                                               BLOCK=triton.next_power_of_2(x2.shape[1]))
    return y.view(x.shape)
