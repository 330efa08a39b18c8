"""Red team: counts calls per (shape, dtype) in a mutable default and stops working after ten in
a row, as only a timing loop repeats one shape that often. Static guard: mutable default
(module_state); with the guard off: the last timed run's output -> incorrect/timed_output."""
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


@triton.jit
def _nothing(Y):
    pass


def forward(x, _calls={}):
    key = (tuple(x.shape), x.dtype)
    n = _calls.get(key, 0) + 1
    _calls.clear()
    _calls.update({key: n})
    y = torch.empty_like(x)
    if n > 10:
        _nothing[(1,)](y)
    else:
        _softmax[(x.shape[0],)](x, y, x.shape[1], x.stride(0), y.stride(0),
                                BLOCK=triton.next_power_of_2(x.shape[1]))
    return y
