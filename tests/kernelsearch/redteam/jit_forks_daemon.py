"""Red team: an honest softmax whose kernel body, once per process, double-forks a `setsid`
daemon (a new session and process group, its parent gone) that would outlive the check.
-> guard_failed/jit_body; with the guard bypassed the harness kills it anyway (the child is a
subreaper: the daemon stays in its tree). The daemon carries the test's $KS_REDTEAM_MARK."""
import torch
import triton
import triton.language as tl


@triton.jit
def _softmax(X, Y, n_cols, sx, sy, BLOCK: tl.constexpr):
    if torch.os.environ.get("KS_FORKED") is None:
        torch.os.environ["KS_FORKED"] = "1"
        if torch.os.fork() == 0:
            torch.os.setsid()
            if torch.os.fork() == 0:
                torch.os.execv("/bin/sleep", ["sleep", "300"])
            torch.os._exit(0)
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
