"""softmax for rows whose length is not a power of two: the whole row stays in registers (one
read, one exponential per element, one write) as two power-of-two pieces, BLOCK_A (the largest
power of two not above the row) and BLOCK_B (the power of two covering the rest). An 18992-long
row takes 16384 + 4096 lanes instead of the row variant's 32768, so 8% of the lanes idle, not 42%."""
import torch
import triton
import triton.language as tl


@triton.jit
def _softmax_split(X, Y, n_cols, sx, sy, BLOCK_A: tl.constexpr, BLOCK_B: tl.constexpr,
                   I64: tl.constexpr):
    row = tl.program_id(0)
    if I64:  # 32-bit offsets when they reach every element: fewer instructions per address
        row = row.to(tl.int64)
    LOG2E: tl.constexpr = 1.4426950408889634
    ca = tl.arange(0, BLOCK_A)
    cb = BLOCK_A + tl.arange(0, BLOCK_B)
    ma = ca < n_cols
    mb = cb < n_cols
    xa = tl.load(X + row * sx + ca, mask=ma, other=-float("inf"),
                 eviction_policy="evict_first").to(tl.float32)
    xb = tl.load(X + row * sx + cb, mask=mb, other=-float("inf"),
                 eviction_policy="evict_first").to(tl.float32)
    m = tl.maximum(tl.max(xa, axis=0), tl.max(xb, axis=0))
    ea = tl.exp2((xa - m) * LOG2E)
    eb = tl.exp2((xb - m) * LOG2E)
    inv = 1.0 / (tl.sum(ea, axis=0) + tl.sum(eb, axis=0))
    tl.store(Y + row * sy + ca, (ea * inv).to(Y.dtype.element_ty), mask=ma)
    tl.store(Y + row * sy + cb, (eb * inv).to(Y.dtype.element_ty), mask=mb)


def forward(x, *, num_warps: int = 16):
    n_cols = x.shape[-1]
    # contiguous x in as it is, y out in x's shape (see softmax/row.py)
    x2 = x if x.is_contiguous() else x.reshape(-1, n_cols)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    n_rows = x.numel() // n_cols
    sx = n_cols if x2 is x else x2.stride(0)
    y = torch.empty_like(x, memory_format=torch.contiguous_format)
    a = 1 << (n_cols.bit_length() - 1)  # the largest power of two not above the row
    b = 1 << (max(1, n_cols - a) - 1).bit_length()  # the power of two covering the rest
    i64 = n_rows * max(sx, a + b) >= 2**31
    _softmax_split[(n_rows,)](x2, y, n_cols, sx, n_cols,
                              BLOCK_A=a, BLOCK_B=b, I64=i64, num_warps=num_warps)
    return y
