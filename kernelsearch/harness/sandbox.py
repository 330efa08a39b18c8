"""Loading a candidate, and watching it while it runs: torch calls made from the candidate's own
code (not from triton's) must be allocation, views or metadata; allocations are poisoned (NaN)
so unwritten elements show; kernel launches are counted (triton's launch hooks, never the
candidate's namespace); threads and timer patches are seen."""
from __future__ import annotations

import __future__
import atexit
import hashlib
import importlib.util
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import ModuleType

import torch
from torch.overrides import TorchFunctionMode

ALLOC = {"empty", "empty_like", "empty_strided", "new_empty"}
ZEROS = {"zeros", "zeros_like"}
ALLOWED = ALLOC | ZEROS | {
    "size", "stride", "numel", "dim", "is_contiguous", "contiguous", "view", "reshape",
    "flatten", "unsqueeze", "squeeze", "t", "transpose", "permute", "expand", "data_ptr",
    "element_size", "unbind", "__get__", "__getitem__", "__len__", "__format__", "__repr__",
    "__hash__", "is_floating_point", "storage_offset", "untyped_storage", "nbytes", "__index__",
    "__int__", "__bool__", "get_device", "is_complex", "_is_view",
}
TORCH_DIR = os.path.dirname(torch.__file__)

# Timers and syncs the harness relies on, snapshotted before any candidate is imported; a
# candidate that swaps one (on the module or the class) is caught by `patched()`.
SENTINELS = {
    "time.perf_counter": (time, "perf_counter"),
    "time.time": (time, "time"),
    "time.monotonic": (time, "monotonic"),
    "torch.cuda.synchronize": (torch.cuda, "synchronize"),
    "torch.cuda.Event": (torch.cuda, "Event"),
    "torch.cuda.Event.record": (torch.cuda.Event, "record"),
    "torch.cuda.Event.elapsed_time": (torch.cuda.Event, "elapsed_time"),
    "torch.cuda.Event.synchronize": (torch.cuda.Event, "synchronize"),
    "torch.cuda.CUDAGraph.replay": (torch.cuda.CUDAGraph, "replay"),
    "torch.Tensor.zero_": (torch.Tensor, "zero_"),
}
#: an attribute a host process has already replaced may be missing: inside vLLM's CPU build
#: `torch.cuda.Event` is a placeholder class with no `record`; absent is then what is watched
_ABSENT = object()
_SNAPSHOT = {k: getattr(obj, attr, _ABSENT) for k, (obj, attr) in SENTINELS.items()}


def _snapshot_triton() -> None:
    try:
        import triton.testing as tt

        SENTINELS["triton.testing.do_bench"] = (tt, "do_bench")
        _SNAPSHOT["triton.testing.do_bench"] = tt.do_bench
    except Exception:  # triton.testing needs no GPU; tolerate its absence
        pass


_snapshot_triton()


def patched() -> list[str]:
    """Names of harness timers/syncs that no longer are what they were at start-up."""
    return [k for k, (obj, attr) in SENTINELS.items()
            if getattr(obj, attr, _ABSENT) is not _SNAPSHOT[k]]


def restore() -> None:
    for k, (obj, attr) in SENTINELS.items():
        if _SNAPSHOT[k] is not _ABSENT:
            setattr(obj, attr, _SNAPSHOT[k])
        elif hasattr(obj, attr):  # added since: take it away again
            delattr(obj, attr)


_dirs: list[str] = []  # the ks-src-* dirs load() made, removed by cleanup()
# compiled as if the module began `from __future__ import annotations`: an annotation is kept
# as text and never evaluated, so `PROBE: exec("...") = 0` runs nothing at import, in the
# judge or in the model's process (Triton reads `tl.constexpr` from the text as well)
_FLAGS = __future__.annotations.compiler_flag


def module_name(source: str) -> str:
    """The one module name a source is loaded under, everywhere: derived from its digest."""
    return f"ks_src_{hashlib.sha256(source.encode()).hexdigest()[:16]}"


def load(source: str, tag: str = "") -> ModuleType:
    """Import candidate source from a real file (triton reads kernel source via inspect): the
    one loader of the judge, `dispatch.install` and so the torch custom ops. Module name, file
    name and folder prefix depend on the source only (`tag` is the caller's label, never seen
    by the candidate), so nothing about its loading tells a judged run from an installed one.
    The file's dir lives until `cleanup()` (the judge calls it when done; at exit otherwise)."""
    name = module_name(source)
    if not _dirs:
        atexit.register(cleanup)
    d = Path(tempfile.mkdtemp(prefix="ks-src-"))
    _dirs.append(str(d))
    path = d / f"{name}.py"
    path.write_text(source)
    code = compile(source, str(path), "exec", flags=_FLAGS, dont_inherit=True)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    exec(code, mod.__dict__)
    return mod


def cleanup(keep: int = 0) -> None:
    """Remove the candidate dirs made since there were `keep` of them."""
    while len(_dirs) > keep:
        shutil.rmtree(_dirs.pop(), ignore_errors=True)


def loaded() -> int:
    return len(_dirs)


class LaunchCount:
    """Counts the triton kernel launches this thread makes while open (`with LaunchCount() as
    c: ...; c.count`, `c.by_name`), without touching the candidate's module: what a candidate
    sees while judged is what it sees in use. Compiled kernels: triton's launch hook
    (`triton.knobs.runtime.launch_enter_hook`: a HookChain in newer releases, 3.9 here; one
    plain hook in 3.4; `CompiledKernel.launch_enter_hook` before), added while a count is open
    and removed after (no hook stays in the timed runs). Under TRITON_INTERPRET=1 no launch
    hook is called, so the count is taken at the interpreter's grid executor
    (`GridExecutor.__call__`, the one place an interpreted `kernel[grid](...)` launches),
    wrapped once at the class. Every launch of the thread counts, not only the candidate's own
    kernels: in the judge's window only the candidate's forward runs."""

    def __init__(self) -> None:
        self.count = 0
        self.by_name: dict[str, int] = {}

    def _add(self, name: str) -> None:
        self.count += 1
        self.by_name[name] = self.by_name.get(name, 0) + 1

    def __enter__(self) -> "LaunchCount":
        with _count_lock:
            _counts.setdefault(threading.get_ident(), []).append(self)
            if sum(map(len, _counts.values())) == 1:
                _hook_on()
        return self

    def __exit__(self, *exc) -> None:
        with _count_lock:
            open_ = _counts.get(threading.get_ident(), [])
            if self in open_:
                open_.remove(self)
            if not open_:
                _counts.pop(threading.get_ident(), None)
            if not _counts:
                _hook_off()


_counts: dict[int, list[LaunchCount]] = {}  # thread -> the counts open in it
_count_lock = threading.Lock()
_unhook: list = []  # how to take our launch hook off again


def _launched(name: str) -> None:
    for c in _counts.get(threading.get_ident(), ()):
        c._add(name)


def _on_launch(metadata=None, *_a, **_k) -> None:
    """triton's launch-enter hook: called by the launcher, before the kernel is queued."""
    data = getattr(metadata, "data", None)
    _launched(str(data.get("name", "?")) if isinstance(data, dict) else "?")


def _hook_on() -> None:
    import triton

    _wrap_interpreter()
    knobs = getattr(triton, "knobs", None)
    rt = getattr(knobs, "runtime", None)
    if rt is not None and hasattr(rt, "launch_enter_hook"):
        chain = rt.launch_enter_hook
        if hasattr(chain, "add") and hasattr(chain, "remove"):  # a HookChain
            chain.add(_on_launch)
            _unhook.append(lambda: chain.remove(_on_launch))
            return
        _hook_before(rt)  # one hook or None (Triton 3.4)
        return
    from triton.compiler import CompiledKernel  # Triton < 3.4

    _hook_before(CompiledKernel)


def _hook_before(owner) -> None:
    """`owner.launch_enter_hook` (a plain hook or None) becomes ours first, then whatever was
    there; undone by `_unhook`."""
    prev = owner.launch_enter_hook

    def both(md, _prev=prev):
        _on_launch(md)
        if _prev is not None:
            _prev(md)

    owner.launch_enter_hook = both
    _unhook.append(lambda: setattr(owner, "launch_enter_hook", prev))


def _hook_off() -> None:
    while _unhook:
        _unhook.pop()()


_interp_wrapped = False


def _wrap_interpreter() -> None:
    """Count interpreted launches at GridExecutor.__call__ (once per process; outside an open
    count the wrapper only checks a dict; only the interpreter runs it)."""
    global _interp_wrapped
    if _interp_wrapped:
        return
    try:
        from triton.runtime.interpreter import GridExecutor
    except ImportError:  # an interpreter without it: compiled launches only
        return
    real = GridExecutor.__call__

    def __call__(self, *args, **kwargs):
        if _counts:
            _launched(getattr(self.fn, "__name__", "?"))
        return real(self, *args, **kwargs)

    GridExecutor.__call__ = __call__
    _interp_wrapped = True


def _poison(t, value: float = float("nan")):
    if isinstance(t, torch.Tensor) and t.numel():
        if t.is_floating_point():
            t.fill_(value)
        elif t.dtype != torch.bool:
            t.fill_(-1)
    return t


class Sandbox(TorchFunctionMode):
    """Active only around forward(): flags torch compute called from candidate files."""

    def __init__(self, files: set[str], poison: bool = True, value: float = float("nan")):
        super().__init__()
        self.files = files
        self.poison = poison
        self.value = value  # what allocations are filled with (the judge varies it)
        self.violations: list[str] = []

    def _caller_is_candidate(self) -> bool:
        f = sys._getframe(2)
        while f is not None and (f.f_code.co_filename.startswith(TORCH_DIR)
                                 or f.f_code.co_filename == __file__):
            f = f.f_back
        return f is not None and f.f_code.co_filename in self.files

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        if self._caller_is_candidate():
            if name not in ALLOWED:
                self.violations.append(name)
            out = func(*args, **kwargs)
            if self.poison and name in ALLOC:
                _poison(out, self.value)
            return out
        return func(*args, **kwargs)


_thread_start = threading.Thread.start


class Watch:
    """Threads started (even if joined before return) and timers patched while a candidate ran.
    Thread.start is wrapped for the duration of the call; a start whose stack passes through a
    candidate file is recorded (triton or torch starting their own threads is not)."""

    def __init__(self, files: set[str] = frozenset()):
        self.files = files
        self.started: list[str] = []

    def __enter__(self):
        watch = self

        def start(thread, *a, **k):
            f = sys._getframe(1)
            while f is not None:
                if f.f_code.co_filename in watch.files:
                    watch.started.append(thread.name)
                    break
                f = f.f_back
            return _thread_start(thread, *a, **k)

        threading.Thread.start = start
        return self

    def __exit__(self, *exc):
        threading.Thread.start = _thread_start
        self.new_threads = list(self.started)
        self.patched = patched()
        return False
