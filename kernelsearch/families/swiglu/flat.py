"""swiglu: silu(gate) * up, elementwise over the flattened tensors, fp32 math."""
import torch
import triton
import triton.language as tl


@triton.jit
def _swiglu_flat(G, U, Y, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    g = tl.load(G + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(U + offs, mask=mask, other=0.0).to(tl.float32)
    y = g / (1.0 + tl.exp2(-g * 1.4426950408889634)) * u
    tl.store(Y + offs, y.to(Y.dtype.element_ty), mask=mask)


def forward(gate, up, *, BLOCK: int = 1024, num_warps: int = 4):
    g = gate if gate.is_contiguous() else gate.contiguous()
    u = up if up.is_contiguous() else up.contiguous()
    y = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    n = g.numel()
    _swiglu_flat[((n + BLOCK - 1) // BLOCK,)](g, u, y, n, BLOCK=BLOCK, num_warps=num_warps)
    return y
