"""rope over the flattened (sequence, head, pair) index space: BLOCK pairs per program, each
pair's (sequence, head, lane) recovered by division. Honours x's strides; a cos/sin with one row
is broadcast (row stride 0)."""
import torch
import triton
import triton.language as tl


@triton.jit
def _rope_flat(X, C, S, Y, n, NH, half, sxb, sxh, sxd, scb, scd, ssb, ssd,
               BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    j = i % half
    t = i // half  # sequence * NH + head
    b = t // NH
    h = t % NH
    c = tl.load(C + b * scb + j * scd, mask=m, other=0.0).to(tl.float32)
    s = tl.load(S + b * ssb + j * ssd, mask=m, other=0.0).to(tl.float32)
    xp = X + b * sxb + h * sxh + j * sxd
    x1 = tl.load(xp, mask=m, other=0.0).to(tl.float32)
    x2 = tl.load(xp + half * sxd, mask=m, other=0.0).to(tl.float32)
    yp = Y + t * (2 * half) + j
    tl.store(yp, (x1 * c - x2 * s).to(Y.dtype.element_ty), mask=m)
    tl.store(yp + half, (x2 * c + x1 * s).to(Y.dtype.element_ty), mask=m)


def forward(x, cos, sin, *, BLOCK: int = 1024, num_warps: int = 4):
    B, NH, D = x.shape
    half = D // 2
    y = torch.empty((B, NH, D), dtype=x.dtype, device=x.device)
    n = B * NH * half
    scb = cos.stride(0) if cos.shape[0] > 1 else 0
    ssb = sin.stride(0) if sin.shape[0] > 1 else 0
    _rope_flat[((n + BLOCK - 1) // BLOCK,)](x, cos, sin, y, n, NH, half,
                                         x.stride(0), x.stride(1), x.stride(2),
                                         scb, cos.stride(1), ssb, sin.stride(1),
                                         BLOCK=BLOCK, num_warps=num_warps)
    return y
