"""Red team (issue 24): a module-level annotation is evaluated at import, so its exec runs
wherever the source is imported (the judge's sandbox, then dispatch.install in the daemon).
Here it would end the process with status 3 -> guard_failed/annotation_not_allowed, and the
payload never runs."""
import torch
import triton
import triton.language as tl

PROBE: exec("raise SystemExit(3)") = 0


@triton.jit
def _softmax(X, Y, n_cols, sx, sy, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    x = tl.load(X + row * sx + cols, mask=cols < n_cols, other=-float("inf")).to(tl.float32)
    e = tl.exp(x - tl.max(x, 0))
    tl.store(Y + row * sy + cols, (e / tl.sum(e, 0)).to(Y.dtype.element_ty), mask=cols < n_cols)


def forward(x):
    x2 = x.reshape(-1, x.shape[-1])
    y = torch.empty_like(x2)
    _softmax[(x2.shape[0],)](x2, y, x2.shape[1], x2.stride(0), y.stride(0),
                             BLOCK=triton.next_power_of_2(x2.shape[1]))
    return y.view(x.shape)

