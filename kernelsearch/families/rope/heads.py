"""rope, one program per (sequence, block of BLOCK_H heads): a [BLOCK_H, D/2] tile of pairs, the
sequence's cos/sin row loaded once. Honours x's strides (a strided q|k view needs no copy); a
cos/sin with one row is broadcast (row stride 0)."""
import torch
import triton
import triton.language as tl


@triton.jit
def _rope_heads(X, C, S, Y, NH, half, sxb, sxh, sxd, scb, scd, ssb, ssd,
                BLOCK_H: tl.constexpr, HALF: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    h = (tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)).to(tl.int64)
    j = tl.arange(0, HALF)
    jm = j < half
    m = (h < NH)[:, None] & jm[None, :]
    c = tl.load(C + b * scb + j * scd, mask=jm, other=0.0).to(tl.float32)[None, :]
    s = tl.load(S + b * ssb + j * ssd, mask=jm, other=0.0).to(tl.float32)[None, :]
    xp = X + b * sxb + h[:, None] * sxh + j[None, :] * sxd
    x1 = tl.load(xp, mask=m, other=0.0).to(tl.float32)
    x2 = tl.load(xp + half * sxd, mask=m, other=0.0).to(tl.float32)
    yp = Y + (b * NH + h[:, None]) * (2 * half) + j[None, :]
    tl.store(yp, (x1 * c - x2 * s).to(Y.dtype.element_ty), mask=m)
    tl.store(yp + half, (x2 * c + x1 * s).to(Y.dtype.element_ty), mask=m)


def forward(x, cos, sin, *, BLOCK_H: int = 4, num_warps: int = 4):
    B, NH, D = x.shape
    half = D // 2
    y = torch.empty((B, NH, D), dtype=x.dtype, device=x.device)
    scb = cos.stride(0) if cos.shape[0] > 1 else 0
    ssb = sin.stride(0) if sin.shape[0] > 1 else 0
    grid = (B, (NH + BLOCK_H - 1) // BLOCK_H)
    _rope_heads[grid](x, cos, sin, y, NH, half, x.stride(0), x.stride(1), x.stride(2),
                      scb, cos.stride(1), ssb, sin.stride(1),
                      BLOCK_H=BLOCK_H, HALF=1 << (half - 1).bit_length(), num_warps=num_warps)
    return y
