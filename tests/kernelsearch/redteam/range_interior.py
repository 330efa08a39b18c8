"""Red team (issue 24): wrong only for 300-500 rows, inside a table range of 8-600 rows whose
ends are right (the 5,001-8,000 rows of an 8-65,536 range, at CPU size): the judge checks a
range's midpoint and the geometric midpoint of every octave in it (362 rows) ->
incorrect/unwritten (the last row is never written). Everywhere else it is an honest softmax
at every width: a program takes ROWS rows of at most 4,096 elements in all (64 rows of a
narrow row keep the interpreter's grid small; one row of a 32,769-wide one compiles on a GPU,
where 64 such rows exceeded Triton's block limit)."""
import torch
import triton
import triton.language as tl


@triton.jit
def _softmax(X, Y, n_rows, n_cols, sx, sy, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    m = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    r64 = rows.to(tl.int64)[:, None]
    x = tl.load(X + r64 * sx + cols[None, :], mask=m, other=-float("inf")).to(tl.float32)
    e = tl.exp(x - tl.max(x, 1)[:, None])
    y = e / tl.sum(e, 1)[:, None]
    tl.store(Y + r64 * sy + cols[None, :], y.to(Y.dtype.element_ty), mask=m)


def forward(x):
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    y = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    rows = x2.shape[0]
    done = rows if rows < 300 or rows > 500 else rows - 1
    block = triton.next_power_of_2(x2.shape[1])
    per = max(1, min(64, 4096 // block))
    _softmax[(triton.cdiv(done, per),)](x2, y, done, x2.shape[1], x2.stride(0), y.stride(0),
                                        ROWS=per, BLOCK=block)
    return y.view(x.shape)
