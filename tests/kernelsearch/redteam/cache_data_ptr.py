"""Red team: returns a result cached on the input data pointer -> guard_failed/module_state (static); with the static guard off, the in-place rewrite of the inputs catches it (incorrect).

Apart from its cache it is the honest candidate (every layout the judge draws), so whatever the
judge rejects it for is the cache."""
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

CACHE = dict()


def forward(x):
    key = (x.data_ptr(), tuple(x.shape))
    if key in CACHE:
        return CACHE[key]
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(-1) != 1:  # a transposed view: the kernel reads rows with unit stride
        x2 = x2.contiguous()
    y = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    _softmax[(x2.shape[0],)](x2, y, x2.shape[1], x2.stride(0), y.stride(0),
                             BLOCK=triton.next_power_of_2(x2.shape[1]))
    CACHE[key] = y.view(x.shape)
    return CACHE[key]
