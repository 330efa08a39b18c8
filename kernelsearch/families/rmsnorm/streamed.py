"""rmsnorm for long rows with cache hints (what inductor emits for a looped reduction): the
sum-of-squares pass loads the row with evict_last so it stays in L2 for the second pass, which
streams it out with evict_first; the weight, shared by every row, is kept (evict_last). Offsets
are 32-bit when they reach every element, as inductor's are. (Several rows per program, as
inductor's XBLOCK, was tried on the H200: 3-42% slower at every large shape.)"""
import torch
import triton
import triton.language as tl


@triton.jit
def _rmsnorm_streamed(X, W, Y, n_cols, sx, sy, eps, BLOCK: tl.constexpr, STAGES: tl.constexpr,
                      I64: tl.constexpr):
    row = tl.program_id(0)
    if I64:
        row = row.to(tl.int64)
    cols = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)
    for c0 in tl.range(0, n_cols, BLOCK, num_stages=STAGES):
        c = c0 + cols
        x = tl.load(X + row * sx + c, mask=c < n_cols, other=0.0,
                    eviction_policy="evict_last").to(tl.float32)
        acc += x * x
    r = tl.rsqrt(tl.sum(acc, axis=0) / n_cols + eps)
    for c0 in tl.range(0, n_cols, BLOCK, num_stages=STAGES):
        c = c0 + cols
        cm = c < n_cols
        x = tl.load(X + row * sx + c, mask=cm, other=0.0, eviction_policy="evict_first").to(tl.float32)
        w = tl.load(W + c, mask=cm, other=0.0, eviction_policy="evict_last").to(tl.float32)
        tl.store(Y + row * sy + c, (x * r * w).to(Y.dtype.element_ty), mask=cm)


def forward(x, weight, eps, *, BLOCK: int = 1024, STAGES: int = 2, num_warps: int = 4):
    n_cols = x.shape[-1]
    weight = weight.contiguous()  # a strided weight view: the kernel reads it with unit stride
    # contiguous x in as it is, y out in x's shape (see softmax/row.py)
    x2 = x if x.is_contiguous() else x.reshape(-1, n_cols)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    n_rows = x.numel() // n_cols
    sx = n_cols if x2 is x else x2.stride(0)
    y = torch.empty_like(x, memory_format=torch.contiguous_format)
    i64 = n_rows * max(sx, n_cols) >= 2**31
    _rmsnorm_streamed[(n_rows,)](x2, weight, y, n_cols, sx, n_cols, eps,
                                 BLOCK=BLOCK, STAGES=STAGES, I64=i64, num_warps=num_warps)
    return y
