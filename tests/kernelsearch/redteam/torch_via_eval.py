"""Red team (issue 24): torch.softmax reached through the builtin eval (no attribute chain the
old guard followed; the sandbox did not attribute the call to the candidate's file) ->
guard_failed/dynamic_code."""
import torch
import triton
import triton.language as tl


@triton.jit
def _copy(X, Y, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(Y + offs, tl.load(X + offs, mask=offs < n), mask=offs < n)


def forward(x):
    ref = eval("torch.softmax(x, -1).contiguous()")
    y = torch.empty_like(ref)
    _copy[(triton.cdiv(ref.numel(), 1024),)](ref, y, ref.numel(), BLOCK=1024)
    return y
