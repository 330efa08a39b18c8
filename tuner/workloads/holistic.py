"""What the holistic workloads share (tuner.workloads.llama, .deepseek, .hf): the size grid and
its defaults per device, the per-size timing loop, the output check cached per runtime (or per
table), and `measure`: check -> time every size -> summarize.

`measure`, `check` and `first_step_s` also hold the one place where a failure of the candidate's
own run is handled: a RuntimeError out of torch, CUDA or Triton (a CUDA graph capture
invalidated, CUDA out of memory, a Triton compile or launch error) becomes `WorkloadFailed` with
one line (workload, size, the error's first line), which a search records as a rejected trial
before it measures the incumbent again. First the runners and their graphs are dropped and the
cached memory freed, so that next measurement starts clean. A programming error (TypeError,
AttributeError, ...) is no run failure and propagates as it is. A device still failing after
that (a sticky CUDA error such as an illegal memory access: every later call on the context
fails) raises `WorkloadBroken` instead, now and on every later call: the search must stop.

No pydantic here (this runs on bare GPU machines); `measure` builds `tuner.trial.Measurement`
lazily.
"""
from __future__ import annotations

import gc
import json
import logging
import os
import time
import traceback
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Callable, ClassVar, Mapping, Optional, Sequence, TypeVar

from tuner.errors import WorkloadBroken, WorkloadFailed

log = logging.getLogger(__name__)
T = TypeVar("T")
C = TypeVar("C", bound="Presets")


class Presets:
    """`preset(name)` and `of(model)` for a model's config dataclass; `PRESETS` is its module's
    dict of named configs, set on the class once that dict is built."""

    PRESETS: ClassVar[Mapping[str, Any]] = {}

    @classmethod
    def preset(cls: type[C], name: str) -> C:
        if name not in cls.PRESETS:
            raise ValueError(f"model: unknown preset {name!r}; expected one of "
                             f"{', '.join(cls.PRESETS)}")
        return cls.PRESETS[name]

    @classmethod
    def of(cls: type[C], model: Any) -> C:
        """A preset name, a config, or a dict of its fields."""
        if isinstance(model, str):
            return cls.preset(model)
        return model if isinstance(model, cls) else cls(**dict(model))


class RuntimeSettings:
    """`known(d)` and `key()` for a workload's runtime dataclass (Candidate.runtime)."""

    @classmethod
    def known(cls, d: Optional[Mapping[str, Any]]) -> dict[str, Any]:
        """`d` as a dict of this class's fields; unknown keys refused (ValueError naming them)."""
        d = dict(d or {})
        names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"runtime: unknown setting(s) {', '.join(unknown)}; "
                             f"expected some of {', '.join(sorted(names))}")
        return d

    def key(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)  # type: ignore[call-overload]


# -- the size grid -------------------------------------------------------------------------------


@dataclass
class SizeGrid:
    contexts: list[int] = field(default_factory=lambda: [4096, 16384, 65536, 131072])
    decode_batches: list[int] = field(default_factory=lambda: [8])
    prefill_batches: list[int] = field(default_factory=lambda: [1])
    decode_steps: int = 20  # replays timed per repeat
    prefill: bool = True
    decode: bool = True

    def sizes(self) -> list[tuple[str, int, int]]:
        out = []
        for ctx in self.contexts:
            if self.prefill:
                out += [("prefill", b, ctx) for b in self.prefill_batches]
            if self.decode:
                out += [("decode", b, ctx) for b in self.decode_batches]
        return out


def size_key(kind: str, batch: int, ctx: int) -> str:
    return f"{kind}@ctx{ctx},b{batch}"


@dataclass(frozen=True)
class GridDefaults:
    """A workload's grid where its caller names none: one for CPU tests, one for a GPU."""

    contexts: tuple[int, ...]
    decode_batch: int
    decode_steps: int


def size_grid(cpu: GridDefaults, gpu: GridDefaults, device: str,
              contexts: Optional[Sequence[int]] = None,
              decode_batches: Optional[Sequence[int]] = None,
              prefill_batches: Optional[Sequence[int]] = None,
              decode_steps: Optional[int] = None, prefill: bool = True,
              decode: bool = True) -> SizeGrid:
    d = cpu if device == "cpu" else gpu
    return SizeGrid(contexts=list(contexts or d.contexts),
                    decode_batches=list(decode_batches or [d.decode_batch]),
                    prefill_batches=list(prefill_batches or [1]),
                    decode_steps=decode_steps or d.decode_steps, prefill=prefill, decode=decode)


#: GPU time run untimed before each size's samples: after a side switch (a re-capture, a
#: recompile: seconds of CPU work) the GPU has dropped to idle clocks, and a 20-step sample of a
#: 1 ms step is over before it clocks up (on the H200 the first sample of a size read 20-40% low)
WARM_S = 0.2


def warm(fn: Callable[[], Any], device: Any, seconds: float = WARM_S) -> None:
    """Run `fn` until `seconds` of device time have passed (nothing on the CPU)."""
    if getattr(device, "type", "cpu") != "cuda":
        return
    t = _Timer(device)
    spent, n = 0.0, 1
    while spent < seconds:
        spent += t(fn, n)
        n = min(2 * n, 64)


class _Timer:
    """Wall time of a region: CUDA events on a GPU, perf_counter on the CPU."""

    def __init__(self, device: Any):
        self.device = device

    def __call__(self, fn: Callable[[], Any], n: int) -> float:
        import torch

        if self.device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(n):
                fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        return time.perf_counter() - t0


#: called at every sample boundary of `time_sizes`: (size key, None) before a size's first
#: sample, (size key, the sample's tokens/s) after each. A model process's server sets it to a
#: round trip with its parent, which times every sample on its own clock and keeps only that
#: (tuner.workloads.model_trust): the process runs candidate code, its numbers are a claim
SAMPLE_MARK: Optional[Callable[[str, Optional[float]], None]] = None


def _mark(key: str, rate: Optional[float]) -> None:
    if SAMPLE_MARK is not None:
        SAMPLE_MARK(key, rate)


def time_sizes(bench: Any, rt: Any, sizes: Sequence[tuple[str, int, int]], repeats: int,
               deadline: Optional[float]) -> dict[str, Any]:
    """Per size: `repeats` tokens/s samples of `bench.runner(rt, ...)` and its setup seconds;
    sizes reached past the deadline are skipped (listed in 'skipped'). `bench.at` names the
    size being prepared or timed, so a failure can say where it happened. Each sample is
    bracketed by `SAMPLE_MARK` calls (nothing else runs between them)."""
    import torch

    from tuner.workloads.energy import SizeEnergy, medians

    per: dict[str, list[float]] = {}
    setup: dict[str, float] = {}
    skipped: list[str] = []
    energy = SizeEnergy(bench.model.device)  # mean watts per size where measured (GPU only)
    with torch.no_grad():
        for kind, b, ctx in sizes:
            key = size_key(kind, b, ctx)
            if deadline is not None and time.time() > deadline:
                skipped.append(key)
                continue
            bench.at = key
            r = bench.runner(rt, kind, b, ctx)
            setup[key] = r.setup_s
            steps = bench.grid.decode_steps if kind == "decode" else 1
            warm(r.step, bench.model.device)
            try:
                with energy.window(key, r.step):
                    per[key] = []
                    _mark(key, None)
                    for _ in range(repeats):
                        per[key].append(r.tokens_per_s(steps))
                        _mark(key, per[key][-1])
            except BaseException:
                energy.close()
                raise
    energy.close()
    bench.at = None
    return {"per_size_samples": per, "setup_s": setup, "skipped": skipped,
            "energy_record": energy.record(medians(per))}


# -- failures of a run -----------------------------------------------------------------------------


def auto_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def run_failure(e: BaseException) -> bool:
    """Whether `e` is the run failing rather than the code: torch's, CUDA's and Triton's errors
    (RuntimeError and its kinds: torch.AcceleratorError, torch.OutOfMemoryError, dynamo's and
    inductor's; Triton's own TritonError family). Not a RecursionError or NotImplementedError
    of our own making, nor any TypeError, AttributeError, ... (bugs: they propagate)."""
    if isinstance(e, (RecursionError, NotImplementedError)):
        return False
    if isinstance(e, RuntimeError):
        return True
    # triton.errors.TritonError (CompilationError, OutOfResources, PTXASError, ...) subclasses
    # Exception: known by its module, with no triton import where none ran
    return any(c.__module__.split(".")[0] == "triton" for c in type(e).__mro__)


def first_line(e: BaseException, limit: int = 300) -> str:
    lines = [x.strip() for x in str(e).splitlines() if x.strip()]
    text = f"{type(e).__name__}: {lines[0]}" if lines else type(e).__name__
    return text if len(text) <= limit else text[:limit - 3] + "..."


def probe(device: Any) -> None:
    """Free what the failed run cached and make sure the device still runs work; raises when it
    does not (a sticky CUDA error fails every later call, this synchronize included)."""
    if device.type != "cuda":
        return
    import torch

    torch.cuda.empty_cache()
    torch.cuda.synchronize(device)
    torch.ones(1, device=device).add_(1).item()


# -- the workload ----------------------------------------------------------------------------------


class HolisticWorkload:
    """The glue of a holistic workload (tuner.workloads.base.Workload): a model, its `bench`
    (runners per runtime over `grid`), the candidate's `runtime`, the output check of the
    candidate path against the plain one (cached by `_check_key`), and `measure`.

    A subclass sets `model`, `grid`, `bench` and `dispatch` and calls `_start`; it states what
    differs: `Runtime` (the class of its runtime settings), `_check_key` / `_check_now`,
    `_first_runner`, `_extra`, and where it has compiled code, `_compiles`."""

    name = "holistic"
    Runtime: ClassVar[Any]
    #: the runtime settings a mixed search may change, over the values it tries
    RUNTIME_DIMS: ClassVar[Mapping[str, list[Any]]] = {}
    #: per family, the only variants its call path runs (None: any of the family's)
    KERNEL_VARIANTS: ClassVar[Optional[Mapping[str, Sequence[str]]]] = None
    #: what a failed output check says (the mixed evaluator reads "differ from the plain torch
    #: path" as `incorrect`)
    MISMATCH = "outputs differ from the plain torch path"
    model: Any
    grid: SizeGrid
    bench: Any
    dispatch: Any

    def _start(self, runtime: Optional[Any], check_outputs: bool) -> None:
        self.runtime = self.Runtime.from_dict(runtime)
        self.check_outputs = check_outputs
        self._checked: dict[Any, dict[str, Any]] = {}
        self.broken: Optional[str] = None  # why the device is unusable, once it is

    def configure(self, runtime: Optional[Any]) -> None:
        self.runtime = self.Runtime.from_dict(runtime)

    def dispatch_changed(self) -> None:
        """The installed dispatch table changed: runners captured as CUDA graphs hold the old
        table's kernels, and the output checks were made against the old table."""
        self.bench.drop()
        self._checked.clear()

    # -- the rest of tuner.workloads.base.Tunable ----------------------------------------------
    @property
    def device(self) -> str:
        return self.model.device.type

    def runtime_dims(self) -> dict[str, list[Any]]:
        return {k: list(v) for k, v in self.RUNTIME_DIMS.items()}

    def runtime_settings(self) -> dict[str, Any]:
        return asdict(self.runtime)

    def validate_runtime(self, runtime: Mapping[str, Any]) -> Any:
        return self.Runtime.from_dict(runtime)

    def kernels_usable(self) -> Optional[str]:
        if self.device == "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
            return None
        return ("kernels run on the CPU only under Triton's interpreter: set TRITON_INTERPRET=1 "
                "(or --family none)")

    def kernel_calls(self) -> dict[Any, int]:
        from tuner.workloads.trace import trace_kernel_calls

        return trace_kernel_calls(self)

    def kernel_variants(self) -> Optional[Mapping[str, Sequence[str]]]:
        return self.KERNEL_VARIANTS

    #: in this process: shipped variants only (a search holds it in a model process for more)
    runs_stored_sources = False

    def install_table(self, table: Any, store_dir: Optional[Any] = None) -> None:
        from tuner.workloads.base import install_here

        install_here(self, table, store_dir)

    def close(self) -> None:
        pass  # one process: what it holds goes with it

    # -- what differs per workload --------------------------------------------------------------
    def _check_key(self) -> Any:
        """What a check result holds for (None: nothing to check)."""
        return self.runtime.key()

    def _check_now(self) -> dict[str, Any]:
        raise NotImplementedError

    def _first_runner(self, kind: str, batch: int, ctx: int) -> Any:
        raise NotImplementedError

    def _extra(self) -> dict[str, Any]:
        """What a measurement records besides runtime, setup and check."""
        return {"device": str(self.model.device)}

    def _compiles(self) -> bool:
        """Whether the current runtime runs torch.compile'd code (reset after a failure)."""
        return False

    # -- measuring ------------------------------------------------------------------------------
    def check(self) -> Optional[dict[str, Any]]:
        key = self._check_key()
        if key is None:
            return None
        if key not in self._checked:
            self._checked[key] = self._guarded(self._check_now, lambda: "the output check")
        return self._checked[key]

    def first_step_s(self, kind: str = "decode", batch: Optional[int] = None,
                     ctx: Optional[int] = None) -> float:
        """Time to get the first decode step out under the current runtime, setup (capture,
        compile) included: the kind of isolated measurement that favours skipping graphs. A run
        that fails never gets its first step out: inf (its `measure` says why)."""
        b = batch or self.grid.decode_batches[0]
        c = ctx or self.grid.contexts[0]

        def first() -> float:
            t0 = time.perf_counter()
            self._first_runner(kind, b, c).prepare(warmup=1).step()
            _sync(self.model.device)
            return time.perf_counter() - t0

        try:
            return self._guarded(first, lambda: f"first {kind} step at ctx {c}, batch {b}")
        except WorkloadBroken:
            raise
        except WorkloadFailed:
            return float("inf")

    # -- tuner.workloads.base.Served: what a model process's server asks ----------------------
    def timing(self) -> Optional[dict[str, Any]]:
        grid = self.bench.grid
        return {"decode_steps": int(grid.decode_steps), "sizes": [list(s) for s in grid.sizes()]}

    def prepare(self) -> None:
        import torch

        if self.check_outputs:
            self.check()

        def runners() -> None:
            with torch.no_grad():
                for kind, b, ctx in self.bench.grid.sizes():
                    self.bench.at = size_key(kind, b, ctx)  # a failure names its size
                    self.bench.runner(self.runtime, kind, b, ctx)
            self.bench.at = None
        self._guarded(runners, lambda: getattr(self.bench, "at", None) or "setup")

    def measure(self, repeats: int = 5, timeout_s: Optional[float] = None) -> Any:
        from tuner.workloads.base import summarize

        chk = self.check() if self.check_outputs else None
        if chk is not None and not chk["ok"]:
            raise WorkloadFailed(f"{self.name}: {self.MISMATCH}: {chk['errors']} "
                                 f"(tolerance {chk['tol']})")
        deadline = time.time() + timeout_s if timeout_s else None
        res = self._guarded(lambda: self.bench.run(self.runtime, repeats=repeats,
                                                   deadline=deadline),
                            lambda: getattr(self.bench, "at", None) or "setup")
        if res["skipped"]:
            raise WorkloadFailed(f"{self.name}: timed out after {timeout_s}s; not measured: "
                                 f"{', '.join(res['skipped'])}")
        from tuner.workloads.energy import apply

        return apply(summarize("tokens_per_s", "tok/s", res["per_size_samples"], extra={
            "runtime": asdict(self.runtime), "setup_s": res["setup_s"],
            "check": self._checked.get(self._check_key()), **self._extra()}),
            res.get("energy_record"))

    def _guarded(self, fn: Callable[[], T], where: Callable[[], str]) -> T:
        """fn(), with a failure of the run turned into WorkloadFailed (or WorkloadBroken)."""
        if self.broken is not None:
            raise WorkloadBroken(self.broken)
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - sorted by run_failure; the rest re-raised
            if not run_failure(e):
                raise
            failure = f"{self.name}: {where()}: {first_line(e)}"
            if log.isEnabledFor(logging.DEBUG):  # the whole traceback, as text only
                log.debug("%s\n%s", failure, traceback.format_exc())
        # outside the handler, so the traceback and the runner objects its frames hold are
        # gone before the memory is freed
        self._recover(failure)
        raise WorkloadFailed(failure)

    def _recover(self, failure: str) -> None:
        """Drop every runner (graphs captured, compiled steps) and free cached memory; a device
        that still fails after that is broken for good (WorkloadBroken)."""
        compiled = self._compiles()
        self.bench.drop()
        if hasattr(self.bench, "at"):
            self.bench.at = None
        if compiled:
            try:
                import torch

                torch.compiler.reset()  # cudagraph trees of a failed recording with it
            except Exception as e:  # noqa: BLE001 - judged by the probe below
                log.debug("torch.compiler.reset after a failure: %s", first_line(e))
        gc.collect()  # runners hold themselves (their step closures): a cycle
        try:
            probe(self.model.device)
        except Exception as e:  # noqa: BLE001 - any failure here means the device is gone
            self.broken = (f"{failure}; the device is unusable after it ({first_line(e, 160)}): "
                           "a sticky CUDA error, every later call fails; restart the process")
            raise WorkloadBroken(self.broken) from None


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
