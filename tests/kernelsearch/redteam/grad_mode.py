"""Red team (issue 24): right with autograd on (how the judge always ran it), one row only
under torch.no_grad / inference_mode (how models run) -> statically guard_failed/torch_compute
(torch.is_grad_enabled is on no allow-list); with the guard off, the judge's grad modes ->
incorrect/unwritten."""
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
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    y = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    rows = x2.shape[0] if torch.is_grad_enabled() else 1
    _softmax[(rows,)](x2, y, x2.shape[1], x2.stride(0), y.stride(0),
                      BLOCK=triton.next_power_of_2(x2.shape[1]))
    return y.view(x.shape)
