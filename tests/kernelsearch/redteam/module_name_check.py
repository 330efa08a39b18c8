"""Red team (issue 24): tells the judge's load (module ks_cand_...) from dispatch's (ks_src_...)
by its own __name__ and computes one row only when installed -> guard_failed/reflection."""
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
    judged = __name__.startswith("ks_cand")
    x2 = x.reshape(-1, x.shape[-1])
    y = torch.empty_like(x2)
    _softmax[(x2.shape[0] if judged else 1,)](x2, y, x2.shape[1], x2.stride(0), y.stride(0),
                                              BLOCK=triton.next_power_of_2(x2.shape[1]))
    return y.view(x.shape)
