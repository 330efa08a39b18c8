"""Red team (issue 24): writes only output elements that hold NaN (what the judge always
poisoned allocations with) and leaves the rest as the allocator gave them: with timing off (as
dispatch re-judges) nothing else saw it. Large-finite and zero poison -> incorrect/unwritten."""
import torch
import triton
import triton.language as tl


@triton.jit
def _softmax(X, Y, n_cols, sx, sy, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    m = cols < n_cols
    old = tl.load(Y + row * sy + cols, mask=m, other=0.0)
    watched = old != old
    x = tl.load(X + row * sx + cols, mask=m, other=-float("inf")).to(tl.float32)
    e = tl.exp(x - tl.max(x, 0))
    tl.store(Y + row * sy + cols, (e / tl.sum(e, 0)).to(Y.dtype.element_ty), mask=m & watched)


def forward(x):
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    y = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    _softmax[(x2.shape[0],)](x2, y, x2.shape[1], x2.stride(0), y.stride(0),
                             BLOCK=triton.next_power_of_2(x2.shape[1]))
    return y.view(x.shape)

