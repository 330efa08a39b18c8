"""Red team: never writes its output. It allocates the output and launches a kernel that only
reads the input, betting that the allocator hands back the block a reference computation of the
same size just freed, still holding the answer (caught in the field when a harness ran the
reference in the output dtype just before the candidate). The judge poisons the candidate's
allocations and runs the reference after the candidate, on its own buffers -> incorrect/unwritten."""
import torch
import triton
import triton.language as tl


@triton.jit
def _touch(X, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.load(X + offs, mask=offs < n)


def forward(x):
    if x.stride(-1) != 1:  # a transposed view: rows are read with unit stride
        x = x.contiguous()
    y = torch.empty_like(x)
    _touch[((x.numel() + 1023) // 1024,)](x, x.numel(), BLOCK=1024)
    return y
