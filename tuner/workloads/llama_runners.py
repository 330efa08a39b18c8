"""The Llama workload's runners: one (kind, batch, ctx) under one runtime (a CUDA graph, a
torch.compile'd step, or eager), the compile helpers, the output check against the plain path,
and the bench over a size grid. Shared by tuner.workloads.llama, .deepseek, .tensor_parallel."""
from __future__ import annotations

import math
import statistics
import time
from typing import Any, Callable, Optional, Sequence

from tuner.workloads.holistic import SizeGrid, _sync, _Timer, time_sizes
from tuner.workloads.llama_ops import Ops, _spin
from tuner.workloads.llama_runtime import DecoderModel, Runtime
from tuner.workloads.stats import geomean, rel_spread

# -- runners: one (kind, batch, ctx) under one runtime -----------------------------------------


_COMPILED: dict[tuple[int, str, str], Callable[..., Any]] = {}


def compiled(model: DecoderModel, runtime: Runtime, kind: str, dispatch: Any = None) -> Callable[..., Any]:
    """One torch.compile'd step per (model, runtime, kind), shared by every size: the first
    size compiles it, the second recompiles it with dynamic shapes (dynamo's automatic dynamic),
    later sizes reuse that. Each call starts a new cudagraph-tree step."""
    import torch

    key = (id(model), runtime.key(), kind)
    if key not in _COMPILED:
        _allow_recompiles()
        ops = Ops(runtime, dispatch)
        if kind == "decode":
            def body(t: Any, p: Any, c: Any) -> Any:
                return model.decode_step(ops, t, p, c)
        else:
            def body(t: Any, c: Any) -> Any:  # type: ignore[misc]
                return model.prefill(ops, t, c)
        fn = torch.compile(body, mode=runtime.compile_mode)

        if runtime.inductor_graphs():
            def step(*args: Any) -> Any:
                torch.compiler.cudagraph_mark_step_begin()
                return fn(*args)
        else:
            step = fn

        _COMPILED[key] = step
    return _COMPILED[key]


def _allow_recompiles(n: int = 64) -> None:
    import torch

    cfg = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(cfg, name):
            setattr(cfg, name, max(n, getattr(cfg, name)))


def _dynamic_len(cache: list[tuple[Any, Any]]) -> None:
    import torch

    for k, v in cache:
        torch._dynamo.maybe_mark_dynamic(k, 2)  # no error if a kernel choice specialises it
        torch._dynamo.maybe_mark_dynamic(v, 2)


def _static(cache: list[tuple[Any, Any]]) -> None:
    import torch

    for k, v in cache:
        torch._dynamo.mark_static_address(k)
        torch._dynamo.mark_static_address(v)


class DecodeRunner:
    """A decode step at context `ctx` for `batch` sequences, ready to replay.

    Prepare once (cache, warm-up, graph capture or compile); `step()` runs one token per sequence.
    Each step rewrites the same cache slot, so timings are steady and memory stays fixed."""

    def __init__(self, model: DecoderModel, runtime: Runtime, batch: int, ctx: int,
                 cache: Optional[list[tuple[Any, Any]]] = None, dispatch: Any = None, seed: int = 0):
        import torch

        self.model, self.rt, self.batch, self.ctx = model, runtime, batch, ctx
        self.ops = Ops(runtime, dispatch)
        self.cache = cache if cache is not None else model.new_cache(batch, ctx + 1)
        g = torch.Generator(device="cpu").manual_seed(seed)
        self.tokens = torch.randint(0, model.cfg.vocab, (batch,), generator=g).to(model.device)
        # a model with its own cache type (tuner.workloads.deepseek's paged one) says its length
        length = (model.cache_len(self.cache) if hasattr(model, "cache_len")
                  else self.cache[0][0].shape[2])
        if length != ctx + 1:
            raise ValueError(f"decode runner: cache length {length} != ctx + 1")
        model.rope(ctx + 1)
        self.pos = torch.tensor([ctx], device=model.device)
        self.graph: Any = None
        self.out: Any = None
        self.graphed = runtime.graphs_for(batch, ctx)
        self.setup_s = 0.0
        if runtime.compile_mode:
            if runtime.inductor_graphs():
                _static(self.cache)  # written in place: static addresses keep cudagraphs on
            else:  # one compiled step for every context length: no recompile per size
                _dynamic_len(self.cache)
            fn = compiled(model, runtime, "decode", dispatch)
            self._fn: Callable[[], Any] = lambda: fn(self.tokens, self.pos, self.cache)
        else:
            self._fn = lambda: model.decode_step(self.ops, self.tokens, self.pos, self.cache)

    def prepare(self, warmup: int = 2) -> "DecodeRunner":
        t0 = time.perf_counter()
        dev = self.model.device
        if self.graphed and dev.type == "cuda":
            from tuner.workloads.graphs import capture

            self.graph, self.out = capture(self._fn, warmup, dev)
        else:
            if self.rt.compile_mode:  # compile, then cudagraph-tree warm-up and recording
                warmup = max(warmup, 3)
            for _ in range(max(1, warmup)):
                self.out = self._fn()
            if self.graphed:  # CPU emulation of a capture
                _spin(self.rt.emulate_capture_us)
        _sync(dev)
        self.setup_s = time.perf_counter() - t0
        return self

    def step(self) -> Any:
        if self.graph is not None:
            self.graph.replay()
            return self.out
        if self.graphed:  # CPU emulation: one launch for the whole replay
            self.ops.in_graph = False
            self.ops._launch()
            self.ops.in_graph = True
            try:
                self.out = self._fn()
            finally:
                self.ops.in_graph = False
            return self.out
        self.out = self._fn()
        return self.out

    def tokens_per_s(self, steps: int) -> float:
        t = _Timer(self.model.device)(self.step, steps)
        return self.batch * steps / t


class PrefillRunner:
    def __init__(self, model: DecoderModel, runtime: Runtime, batch: int, ctx: int,
                 cache: Optional[list[tuple[Any, Any]]] = None, dispatch: Any = None, seed: int = 0):
        import torch

        self.model, self.rt, self.batch, self.ctx = model, runtime, batch, ctx
        self.ops = Ops(runtime, dispatch)
        self.cache = cache if cache is not None else model.new_cache(batch, ctx)
        g = torch.Generator(device="cpu").manual_seed(seed)
        self.tokens = torch.randint(0, model.cfg.vocab, (batch, ctx), generator=g).to(model.device)
        if runtime.compile_mode:
            _static(self.cache)
            fn = compiled(model, runtime, "prefill", dispatch)
            self._fn: Callable[[], Any] = lambda: fn(self.tokens, self.cache)
        else:
            self._fn = lambda: model.prefill(self.ops, self.tokens, self.cache)
        self.setup_s = 0.0

    def prepare(self, warmup: int = 1) -> "PrefillRunner":
        t0 = time.perf_counter()
        if self.rt.compile_mode:  # compile, then cudagraph-tree warm-up and recording
            warmup = max(warmup, 3)
        for _ in range(max(1, warmup)):
            self._fn()
        _sync(self.model.device)
        self.setup_s = time.perf_counter() - t0
        return self

    def step(self) -> Any:
        return self._fn()

    def tokens_per_s(self, steps: int = 1) -> float:
        t = _Timer(self.model.device)(self.step, steps)
        return self.batch * self.ctx * steps / t


# -- correctness -------------------------------------------------------------------------------


def rel_err(a: Any, b: Any) -> float:
    """‖a − b‖ / ‖b‖ in float64 (NaN anywhere → inf)."""
    import torch

    a64, b64 = a.double(), b.double()
    if not torch.isfinite(a64).all():
        return math.inf
    den = b64.norm().item()
    return (a64 - b64).norm().item() / den if den else (a64 - b64).norm().item()


def default_tolerance(dtype: str) -> float:
    return 2e-2 if dtype in ("bfloat16", "float16") else 1e-4


def check(model: DecoderModel, runtime: Runtime, dispatch: Any = None, batch: int = 2, ctx: int = 64,
          tol: Optional[float] = None, seed: int = 3) -> dict[str, Any]:
    """Outputs of the candidate path (dispatch + runtime settings) against the plain torch path
    (no dispatch, plain attention, unfused) on the same weights and fresh random inputs:
    prefill logits and one decode step after it. Returns errors; `ok` False beyond `tol`."""
    import torch

    tol = default_tolerance(model.cfg.dtype) if tol is None else tol
    plain = Ops(type(runtime)(use_dispatch=False))  # the same settings class, no dispatch
    cand = Ops(runtime, dispatch)
    g = torch.Generator(device="cpu").manual_seed(seed)
    toks = torch.randint(0, model.cfg.vocab, (batch, ctx + 1), generator=g).to(model.device)
    errs = {}
    with torch.no_grad():
        c_ref = model.new_cache(batch, ctx + 1, fill="zeros")
        c_new = model.new_cache(batch, ctx + 1, fill="zeros")
        ref_p = model.prefill(plain, toks[:, :ctx], c_ref)
        new_p = model.prefill(cand, toks[:, :ctx], c_new)
        errs["prefill"] = rel_err(new_p, ref_p)
        ref_d = model.decode_step(plain, toks[:, ctx], ctx, c_ref)
        new_d = model.decode_step(cand, toks[:, ctx], ctx, c_new)
        errs["decode"] = rel_err(new_d, ref_d)
    worst = max(errs.values())
    return {"ok": worst <= tol, "tol": tol, "errors": errs,
            "dispatch": dispatch is not None and runtime.use_dispatch}


# -- a whole table -----------------------------------------------------------------------------


class Bench:
    """Prefill and decode tokens/s over a size grid for one model, runtime by runtime.

    KV caches are shared between runtimes (keyed by batch and length) and runners (graphs,
    compiled functions) are kept per runtime, so A/B alternation re-captures nothing."""

    def __init__(self, model: DecoderModel, grid: SizeGrid, dispatch: Any = None):
        self.model, self.grid, self.dispatch = model, grid, dispatch
        self._caches: dict[tuple[str, int, int], list[tuple[Any, Any]]] = {}
        self._runners: dict[tuple[str, str, int, int], Any] = {}
        self.at: Optional[str] = None  # the size being prepared or timed (time_sizes)

    def _cache(self, kind: str, batch: int, length: int) -> list[tuple[Any, Any]]:
        k = (kind, batch, length)
        if k not in self._caches:
            self._caches[k] = self.model.new_cache(batch, length)
        return self._caches[k]

    def runner(self, rt: Runtime, kind: str, batch: int, ctx: int) -> Any:
        k = (rt.key(), kind, batch, ctx)
        if k not in self._runners:
            if kind == "decode":
                r: Any = DecodeRunner(self.model, rt, batch, ctx, self._cache(kind, batch, ctx + 1),
                                      self.dispatch)
            else:
                r = PrefillRunner(self.model, rt, batch, ctx, self._cache(kind, batch, ctx),
                                  self.dispatch)
            r.prepare()
            self._runners[k] = r
        return self._runners[k]

    def drop(self, rt: Optional[Runtime] = None) -> None:
        """Free runners (and their graphs) of one runtime, or all of them."""
        if rt is None:
            self._runners.clear()
        else:
            key = rt.key()
            for k in [k for k in self._runners if k[0] == key]:
                del self._runners[k]

    def run(self, rt: Runtime, repeats: int = 5, deadline: Optional[float] = None,
            sizes: Optional[Sequence[tuple[str, int, int]]] = None) -> dict[str, Any]:
        """Per size: repeats of tokens/s, the setup seconds; sizes past the deadline are skipped
        (listed in 'skipped')."""
        return time_sizes(self, rt, self.grid.sizes() if sizes is None else sizes, repeats,
                          deadline)


def table_row(result: dict[str, Any]) -> dict[str, Any]:
    """Medians and spreads of a Bench.run result plus its geometric mean (plain dict)."""
    import statistics

    per = result["per_size_samples"]
    n = min((len(v) for v in per.values()), default=0)
    return {
        "per_size": {k: statistics.median(v) for k, v in per.items()},
        "spread": {k: rel_spread(v) for k, v in per.items()},
        "geomean": statistics.median([geomean([v[i] for v in per.values()]) for i in range(n)]) if n else 0.0,
        "setup_s": result.get("setup_s", {}),
        "skipped": result.get("skipped", []),
    }
