"""Launch counting never touches the candidate (issue 24, "nothing a candidate can observe differs
between its judging and its use"): the judge counts a candidate's launches through triton's own
launch hooks (the interpreter's grid executor under TRITON_INTERPRET=1), so its kernels are the
same objects in its module while judged as when installed; counts are per thread, nest, and
leave no hook behind for the timed runs; "launched no kernel" is still caught."""
from __future__ import annotations

import threading

import torch

from kernelsearch.harness import sandbox
from kernelsearch.harness.correctness import Runner

SRC = '''import torch
import triton
import triton.language as tl


@triton.jit
def _double(X, Y, n, BLOCK: tl.constexpr):
    c = tl.arange(0, BLOCK)
    tl.store(Y + c, tl.load(X + c, mask=c < n) * 2, mask=c < n)


@triton.jit
def _add_one(Y, n, BLOCK: tl.constexpr):
    c = tl.arange(0, BLOCK)
    tl.store(Y + c, tl.load(Y + c, mask=c < n) + 1, mask=c < n)


def forward(x):
    y = torch.empty_like(x)
    _double[(1,)](x, y, x.numel(), BLOCK=16)
    _add_one[(1,)](y, x.numel(), BLOCK=16)
    _add_one[(1,)](y, x.numel(), BLOCK=16)
    return y
'''


def test_launches_are_counted_per_kernel_without_replacing_any():
    mod = sandbox.load(SRC, "t")
    kernels = {n: getattr(mod, n) for n in ("_double", "_add_one")}
    x = torch.arange(8, dtype=torch.float32)
    with sandbox.LaunchCount() as outer:
        with sandbox.LaunchCount() as inner:
            y = mod.forward(x)
        mod.forward(x)
    assert torch.equal(y, x * 2 + 2)
    assert inner.count == 3 and inner.by_name == {"_double": 1, "_add_one": 2}
    assert outer.count == 6
    assert {n: getattr(mod, n) for n in kernels} == kernels  # the very same objects
    assert all(type(k).__module__.startswith("triton.") for k in kernels.values())
    mod.forward(x)  # no count open: nothing counted anywhere
    assert outer.count == 6 and inner.count == 3


def test_another_threads_launches_are_not_counted():
    mod = sandbox.load(SRC, "t")
    x = torch.arange(8, dtype=torch.float32)
    go, done = threading.Event(), threading.Event()

    def other():
        go.wait(10)
        mod.forward(x)
        done.set()

    t = threading.Thread(target=other)
    t.start()
    with sandbox.LaunchCount() as c:
        go.set()
        assert done.wait(30)
        mod.forward(x)
    t.join()
    assert c.count == 3


def test_the_judge_sees_the_candidate_as_it_runs_in_use():
    r = Runner(SRC)
    before = dict(vars(r.mod))
    x = torch.arange(8, dtype=torch.float32)
    out, launches = r.call((x,))
    assert launches == 3 and torch.equal(out, x * 2 + 2)
    after = vars(r.mod)
    for name in ("_double", "_add_one", "forward"):
        assert after[name] is before[name]
    installed = sandbox.load(SRC, "installed")  # what dispatch.install loads
    assert type(installed._double) is type(r.mod._double)
    assert installed.__name__ == r.mod.__name__


def test_no_launch_hook_stays_behind_for_timing():
    import triton

    chain = getattr(getattr(triton, "knobs", None), "runtime", None)
    hook_before = getattr(chain, "launch_enter_hook", None)
    calls_before = list(getattr(hook_before, "calls", []))
    with sandbox.LaunchCount():
        hook_open = getattr(chain, "launch_enter_hook", None)
        if hasattr(hook_open, "calls"):
            assert sandbox._on_launch in hook_open.calls
        else:
            assert hook_open is not hook_before
    hook_after = getattr(chain, "launch_enter_hook", None)
    assert hook_after is hook_before
    assert list(getattr(hook_after, "calls", [])) == calls_before


def test_a_forward_that_launches_nothing_is_still_rejected(redteam):
    from kernelsearch.families import get
    from kernelsearch.harness.correctness import _checked_call
    from kernelsearch.harness.verdict import Rejected

    fam = get("softmax")
    r = Runner(redteam("never_launches").read_text())
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(0))
    _, launches = r.call((x,))
    assert launches == 0
    try:
        _checked_call(r, fam, (x,), "float32", "cpu", "softmax (4, 16)")
    except Rejected as e:
        assert e.rule == "no_launch"
    else:
        raise AssertionError("a forward that launched no kernel was accepted")


def _lazy(name: str):
    from triton.compiler.compiler import LazyDict

    return LazyDict({"name": name, "function": None, "stream": 0})


def test_the_compiled_launch_hook_counts_and_keeps_the_applications_hooks(monkeypatch):
    """What the GPU launcher calls (knobs.runtime.launch_enter_hook with the launch's metadata),
    called here as it would: in both forms triton has had since 3.4 (a HookChain; one plain
    hook), a hook the application set is still called, and is what is left afterwards."""
    import triton

    rt = triton.knobs.runtime
    seen = []
    if hasattr(rt.launch_enter_hook, "add"):  # this triton: a HookChain
        rt.launch_enter_hook.add(seen.append)
        try:
            with sandbox.LaunchCount() as c:
                rt.launch_enter_hook(_lazy("_k"))
            assert c.by_name == {"_k": 1} and len(seen) == 1
            assert seen.append in rt.launch_enter_hook.calls
            assert sandbox._on_launch not in rt.launch_enter_hook.calls
        finally:
            rt.launch_enter_hook.remove(seen.append)
    monkeypatch.setattr(rt, "launch_enter_hook", seen.append)  # the 3.4 form: one hook
    seen.clear()
    with sandbox.LaunchCount() as c:
        rt.launch_enter_hook(_lazy("_j"))
        rt.launch_enter_hook(_lazy("_j"))
    assert c.by_name == {"_j": 2} and len(seen) == 2
    assert rt.launch_enter_hook == seen.append
