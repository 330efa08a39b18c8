"""Timing stage: warm-up, median of many runs with the L2 flushed and inputs rotated, device-wide
sync; a CUDA-graph mode; interleaved A/B; the physical floor.

Timer functions are bound at import, before any candidate module is loaded, so a candidate that
patches torch.cuda.Event / time.perf_counter cannot change what the harness reads."""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

_perf = time.perf_counter
_Event = torch.cuda.Event
_record = torch.cuda.Event.record
_elapsed = torch.cuda.Event.elapsed_time
_sync = torch.cuda.synchronize
_zero = torch.Tensor.zero_
_gpu_sleep = torch.cuda._sleep

L2_BYTES = 60 * 2 ** 20  # H200: 60 MB (read off the device where possible)


@dataclass(frozen=True)
class Ceilings:
    """Measured rates the floor is computed from. Defaults: the H200 facts (2026-11-29): the best
    read seen is SDPA decode's 4.57 TB/s (copy 4.25); bf16 dense peak 989 TFLOP/s (datasheet;
    measured cuBLAS best 798)."""

    read_Bps: float = 4.57e12
    flops: float = 989e12
    margin: float = 1.10  # a result must beat the ceiling by more than this to be "impossible"

    def floor_s(self, bytes_moved: float, flops: float) -> float:
        return max(bytes_moved / (self.read_Bps * self.margin), flops / (self.flops * self.margin))


H200 = Ceilings()


def _l2_bytes() -> int:
    try:
        return int(torch.cuda.get_device_properties(0).L2_cache_size) or L2_BYTES
    except Exception:
        return L2_BYTES


class Flusher:
    def __init__(self, device: str):
        self.buf = None
        if device == "cuda":
            self.buf = torch.empty(4 * _l2_bytes() // 4, dtype=torch.int32, device="cuda")

    def __call__(self):
        if self.buf is not None:
            _zero(self.buf)


def rotations(bytes_per_set: float, device: str, cap: int = 16) -> int:
    """How many input sets to cycle through so the working set exceeds the L2 twice."""
    if device != "cuda":
        return 2
    return max(2, min(cap, int(2 * _l2_bytes() / max(bytes_per_set, 1)) + 1))


def bench(fn: Callable, arg_sets: list, device: str, warmup: int = 5, reps: int = 30,
          flush: bool = True, refresh: Optional[Callable[[tuple], None]] = None) -> dict:
    """Median time of fn(*args) over `reps` runs, rotating over arg_sets; events around each run,
    L2 flushed before it (outside the timed region), device-wide sync before reading.
    refresh: called on the last run's input set before it runs (outside the timed region) to
    give it new values in place; the result then holds that run's output as `last` and its set's
    index as `last_index`, so the caller can check what a timed run computed: the same tensors
    as every earlier run (state kept on them persists), values no earlier run saw (no freed
    buffer holds their answer)."""
    n = len(arg_sets)
    for i in range(warmup):
        fn(*arg_sets[i % n])

    def args_of(i: int):
        a = arg_sets[i % n]
        if refresh is not None and i == reps - 1:
            refresh(a)
        return a

    out = None
    if device != "cuda":
        samples = []
        for i in range(reps):
            a = args_of(i)
            t0 = _perf()
            out = fn(*a)
            samples.append(_perf() - t0)
        r = _summary(samples, "wall")
        if refresh is not None:
            r["last"], r["last_index"] = out, (reps - 1) % n
        return r
    flusher = Flusher(device) if flush else None
    _sync()
    starts = [_Event(enable_timing=True) for _ in range(reps)]
    ends = [_Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        if flusher:
            flusher()
        a = args_of(i)
        _record(starts[i])
        out = fn(*a)
        _record(ends[i])
        out = out if i == reps - 1 else None
    _sync()
    r = _summary([_elapsed(s, e) * 1e-3 for s, e in zip(starts, ends)], "events")
    if refresh is not None:
        r["last"], r["last_index"] = out, (reps - 1) % n
    return r


def bench_graph(fn: Callable, arg_sets: list, replays: int = 20, keep_outputs: bool = False
                ) -> dict:
    """CUDA-graph mode: one graph runs fn once per input set (launch gaps removed); the time
    per call is the replay time over the calls in it. keep_outputs: the result also holds
    `outputs`, what the captured calls wrote in the last replay (one per input set), so the
    caller can check what a replay computes."""
    fn(*arg_sets[0])
    _sync()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for a in arg_sets:
            fn(*a)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        outs = [fn(*a) for a in arg_sets]
    g.replay()
    _sync()
    samples = []
    for _ in range(replays):
        e0, e1 = _Event(enable_timing=True), _Event(enable_timing=True)
        _record(e0)
        g.replay()
        _record(e1)
        _sync()
        samples.append(_elapsed(e0, e1) * 1e-3 / len(arg_sets))
    r = _summary(samples, "graph")
    if keep_outputs:  # the graph's pool stays alive with them; the caller drops them
        r["outputs"] = outs
    del g
    return r


_sleep_rate: list[float] = []  # torch.cuda._sleep cycles per microsecond, measured once


def sleep_cycles_per_us() -> float:
    """torch.cuda._sleep cycles per microsecond on this GPU (measured once per process)."""
    if not _sleep_rate:
        e0, e1 = _Event(enable_timing=True), _Event(enable_timing=True)
        _sync()
        _record(e0)
        _gpu_sleep(1_000_000)
        _record(e1)
        _sync()
        _sleep_rate.append(1_000_000 / max(_elapsed(e0, e1) * 1e3, 1e-3))
    return _sleep_rate[0]


def host_cost(fn: Callable, arg_sets: list, device: str, calls: int = 50) -> Optional[float]:
    """Host time of one call (argument handling, allocations, the launches), measured with the
    GPU kept busy so the launch queue never blocks: what an eager caller pays on the CPU per
    call. Where it exceeds the kernel's GPU time the call is launch-bound outside a CUDA graph,
    and an events-mode time measures the host, not the kernel (benchmarks/bench_launch.py).
    None off CUDA, where the wall time already is the whole call."""
    if device != "cuda":
        return None
    n = len(arg_sets)
    fn(*arg_sets[0])
    _sync()
    _gpu_sleep(int(sleep_cycles_per_us() * calls * 500))  # 500 us of GPU work per call
    t0 = _perf()
    for i in range(calls):
        fn(*arg_sets[i % n])
    t = (_perf() - t0) / calls
    _sync()
    return t


def host_costs(fn: Callable, torch_fn: Callable, arg_sets: list, device: str) -> dict:
    """host_us and torch_host_us for a timing record (empty off CUDA). Informational: it never
    decides a verdict, so a failure to measure is recorded, not raised (fn already ran clean)."""
    try:
        ours = host_cost(fn, arg_sets, device)
        if ours is None:
            return {}
        return {"host_us": ours * 1e6, "torch_host_us": host_cost(torch_fn, arg_sets, device) * 1e6}
    except Exception as e:  # noqa: BLE001 - see the docstring
        return {"host_error": f"{type(e).__name__}: {e}"[:200]}


#: how long a kernel runs (CUDA-graph replays) inside one energy window: NVML's counter moves
#: in steps of tens of milliseconds, so a window well over that (the facts' run used ~2 s)
ENERGY_WINDOW_S = 0.5


def energy_per_call(fn: Callable, arg_sets: list, device: str,
                    seconds: float = ENERGY_WINDOW_S, meter: Any = None) -> dict:
    """Joules per call and the board's mean watts while fn runs back to back for `seconds`
    (on CUDA one graph over the input sets, replayed; else the calls themselves), read with
    kernelsearch.energy (NVML, read only): {"energy_j", "mean_w", "energy_source",
    "energy_calls", "energy_mode" (graph|eager), "energy_overhead"}; {"energy_source": "",
    "energy_error": why} where no reading was had. Nothing off CUDA unless a meter is given
    (the CPU draws no GPU power)."""
    if device != "cuda" and meter is None:
        return {}
    from kernelsearch.energy import EnergyMeter

    meter = meter if meter is not None else EnergyMeter(_device_index())
    mode, run = "eager", (lambda: [fn(*a) for a in arg_sets])
    if device == "cuda":
        try:
            mode, run = "graph", _graph_of(fn, arg_sets)
        except Exception:  # noqa: BLE001 - not capturable: the eager calls, said in the record
            mode = "eager"
    calls = 0
    with meter:
        t0 = _perf()
        while calls == 0 or _perf() - t0 < seconds:
            run()
            calls += len(arg_sets)
        if device == "cuda":
            _sync()
    r = meter.reading
    if r.joules is None:
        return {"energy_source": "", "energy_error": r.reason[:300]}
    return {"energy_j": r.joules / calls, "mean_w": r.mean_w, "energy_source": r.source,
            "energy_calls": calls, "energy_mode": mode, "energy_overhead": r.overhead}


def energy_costs(fn: Callable, lib_fn: Optional[Callable], arg_sets: list, device: str) -> dict:
    """energy_per_call for a timing record, and the library kernel's beside it
    (`library_energy_j`, `library_mean_w`, `energy_vs_library`: its joules / ours, >1: ours uses
    less). Informational like host_costs: a failure is recorded, never raised."""
    try:
        rec = energy_per_call(fn, arg_sets, device)
        if lib_fn is not None and rec.get("energy_j"):
            lib = energy_per_call(lib_fn, arg_sets, device)
            if lib.get("energy_j"):
                rec.update(library_energy_j=lib["energy_j"], library_mean_w=lib["mean_w"],
                           energy_vs_library=lib["energy_j"] / rec["energy_j"])
        return rec
    except Exception as e:  # noqa: BLE001 - see the docstring
        return {"energy_source": "", "energy_error": f"{type(e).__name__}: {e}"[:200]}


def _device_index() -> int:
    try:
        return int(torch.cuda.current_device())
    except Exception:  # noqa: BLE001
        return 0


def _graph_of(fn: Callable, arg_sets: list) -> Callable[[], None]:
    """A CUDA graph of one call per input set (as bench_graph captures it); its replay."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for a in arg_sets:
            fn(*a)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for a in arg_sets:
            fn(*a)
    _sync()
    return g.replay


def _summary(samples: list[float], mode: str) -> dict:
    q = statistics.quantiles(samples, n=4) if len(samples) >= 4 else [min(samples), 0, max(samples)]
    return {"median_s": statistics.median(samples), "p25_s": q[0], "p75_s": q[-1],
            "min_s": min(samples), "n": len(samples), "mode": mode}


def ab(fn_a: Callable, fn_b: Callable, arg_sets: list, device: str, rounds: int = 10,
       reps: int = 5) -> dict:
    """Interleaved A/B: A and B alternate round by round so drift (clocks, heat, neighbours)
    hits both. Returns both medians, the ratio B/A and the spread of the per-round ratios."""
    ta, tb, ratios = [], [], []
    for r in range(rounds):
        first, second = (fn_a, fn_b) if r % 2 == 0 else (fn_b, fn_a)
        x = bench(first, arg_sets, device, warmup=1, reps=reps)["median_s"]
        y = bench(second, arg_sets, device, warmup=1, reps=reps)["median_s"]
        a, b = (x, y) if r % 2 == 0 else (y, x)
        ta.append(a)
        tb.append(b)
        ratios.append(b / a)
    q = statistics.quantiles(ratios, n=4) if len(ratios) >= 4 else [min(ratios), 0, max(ratios)]
    return {"a_median_s": statistics.median(ta), "b_median_s": statistics.median(tb),
            "speedup": statistics.median(ratios), "speedup_p25": q[0], "speedup_p75": q[-1],
            "rounds": rounds}


def geomean(values: list[float]) -> float:
    """Geometric mean in log space. Strict: a value that is zero, negative, NaN or infinite
    raises ValueError instead of being dropped or letting one degenerate shape underflow the
    product (a multi-shape score must not be decided by one broken measurement)."""
    vals = [float(v) for v in values]
    bad = [v for v in vals if not (v > 0 and math.isfinite(v))]
    if bad or not vals:
        raise ValueError(f"geometric mean of {vals}: every value must be positive and finite")
    return math.exp(sum(math.log(v) for v in vals) / len(vals))


def degenerate(median_s: float) -> Optional[str]:
    """A time no kernel can take: zero, negative or not a number (a timer or measurement fault,
    never a speed-up). Checked with or without ceilings."""
    if not (median_s > 0 and math.isfinite(median_s)):
        return f"median {median_s!r} s is not a positive finite time"
    return None


def too_fast(median_s: float, bytes_moved: float, flops: float,
             ceilings: Optional[Ceilings]) -> Optional[str]:
    if ceilings is None:
        return None
    floor = ceilings.floor_s(bytes_moved, flops)
    if median_s < floor:
        return (f"median {median_s * 1e6:.3f} us is under the physical floor {floor * 1e6:.3f} us "
                f"({bytes_moved / 1e6:.2f} MB at {ceilings.read_Bps / 1e12:.2f} TB/s, "
                f"{flops / 1e9:.2f} GFLOP at {ceilings.flops / 1e12:.0f} TFLOP/s, "
                f"margin {ceilings.margin:g})")
    return None
