"""Red team: returns its output as a tensor subclass, the vehicle of a lazy output (a subclass's
__torch_function__ runs code when the harness reads the values, so a comparison through torch ops
can be fed while the timed call did no work). Static guard: class at module level
(module_state); with the guard off, the exact-type check -> incorrect/not_plain_tensor."""
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


class LazySoftmax(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return super().__torch_function__(func, types, args, kwargs or {})


def forward(x):
    if x.stride(-1) != 1:  # a transposed view: rows are read with unit stride
        x = x.contiguous()
    y = torch.empty_like(x)
    _softmax[(x.shape[0],)](x, y, x.shape[1], x.stride(0), y.stride(0),
                            BLOCK=triton.next_power_of_2(x.shape[1]))
    return torch.Tensor._make_subclass(LazySoftmax, y)
