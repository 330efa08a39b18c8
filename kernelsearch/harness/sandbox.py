"""Loading a candidate, and watching it while it runs: torch calls made from the candidate's own
code (not from triton's) must be allocation, views or metadata; allocations are poisoned (NaN)
so unwritten elements show; kernel launches are counted; threads and timer patches are seen."""
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
_SNAPSHOT = {k: getattr(obj, attr) for k, (obj, attr) in SENTINELS.items()}


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
    return [k for k, (obj, attr) in SENTINELS.items() if getattr(obj, attr) is not _SNAPSHOT[k]]


def restore() -> None:
    for k, (obj, attr) in SENTINELS.items():
        setattr(obj, attr, _SNAPSHOT[k])


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


class LaunchCounter:
    """Stands in for a jit kernel in the candidate's namespace: counts `kernel[grid](...)`."""

    def __init__(self, fn):
        self.fn = fn
        self.count = 0

    def __getitem__(self, grid):
        launcher = self.fn[grid]

        def launch(*a, **k):
            self.count += 1
            return launcher(*a, **k)

        return launch

    def __getattr__(self, name):
        return getattr(self.fn, name)


def instrument(mod: ModuleType, kernel_names: set[str]) -> list[LaunchCounter]:
    counters = []
    for n in kernel_names:
        fn = getattr(mod, n, None)
        if fn is not None and not isinstance(fn, LaunchCounter):
            c = LaunchCounter(fn)
            setattr(mod, n, c)
            counters.append(c)
    return counters


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
