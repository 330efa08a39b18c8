"""Red team (issue 24): triton.language re-exports Python's builtins module (tl.core.builtins),
whose eval reaches anything: here torch's own softmax, copied into the kernel's output so a
launch is counted -> guard_failed/attribute_not_allowed."""
import torch
import triton
import triton.language as tl


@triton.jit
def _copy(X, Y, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(Y + offs, tl.load(X + offs, mask=offs < n), mask=offs < n)


def forward(x):
    ref = tl.core.builtins.eval("__import__('torch').softmax")(x, -1).contiguous()
    y = torch.empty_like(ref)
    _copy[(triton.cdiv(ref.numel(), 1024),)](ref, y, ref.numel(), BLOCK=1024)
    return y
