"""The real benchmark suite. Each benchmark returns a `Metric` with every repeat kept, so the
report can give a spread and a confidence interval. torch/numpy are imported inside functions:
this module is imported by the child process only.

Timing: CUDA events around a batch of iterations after a warm-up, one sample per batch
(the batch runs well past launch overhead); host-side timings use perf_counter.
"""
from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from tuner.compare.stats import summary


@dataclass
class Metric:
    name: str
    unit: str
    higher_is_better: bool
    samples: list[float] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)
    skipped: str | None = None   # why it did not run (no GPU, one GPU, workload missing...)
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["summary"] = summary(self.samples)
        return d


#: name -> (unit, higher is better, description); the report keeps this order
METRICS: dict[str, tuple[str, bool, str]] = {
    "gemm_bf16_tflops": ("TFLOP/s", True, "bf16 matmul n^3 (cuBLAS)"),
    "device_copy_tbps": ("TB/s", True, "device-to-device copy, bytes read + written"),
    "h2d_pinned_gbps": ("GB/s", True, "host to device, pinned host memory"),
    "d2h_pinned_gbps": ("GB/s", True, "device to host, pinned host memory"),
    "h2d_pageable_gbps": ("GB/s", True, "host to device, pageable host memory"),
    "d2h_pageable_gbps": ("GB/s", True, "device to host, pageable host memory"),
    "launch_eager_us": ("us/kernel", False, "tiny kernel launched eagerly"),
    "launch_graph_us": ("us/kernel", False, "tiny kernel inside one CUDA graph replay"),
    "nccl_allreduce_busbw_gbps": ("GB/s", True, "NCCL all-reduce bus bandwidth, all GPUs"),
    "host_mem_bw_gbps": ("GB/s", True, "host memory copy, bytes read + written"),
    "decode_tok_s": ("tok/s", True, "holistic decode tokens/s, CUDA graph (tuner.workloads.llama)"),
    "decode_eager_tok_s": ("tok/s", True, "holistic decode tokens/s, eager launches"),
    "decode_tok_per_j": ("tok/J", True, "holistic decode tokens per joule of board energy (NVML's energy counter), CUDA graph"),
}


def new(name: str, **params: Any) -> Metric:
    unit, hib, _ = METRICS[name]
    return Metric(name, unit, hib, params=params)


@dataclass
class Config:
    repeats: int = 7
    quick: bool = False      # small sizes: CI and smoke runs, not numbers to quote
    only: set[str] | None = None


def run_all(cfg: Config, log: Callable[[str], None]) -> list[Metric]:
    out: list[Metric] = []
    cuda = _cuda_available()
    for name in METRICS:
        if cfg.only and name not in cfg.only:
            continue
        fn = _BENCHES[name]
        t0 = time.perf_counter()
        try:
            m = fn(cfg, cuda)
        except Exception as e:  # one broken benchmark must not lose the others
            m = new(name)
            m.error = f"{type(e).__name__}: {e}"
        log(f"{name}: {m.skipped or m.error or summary(m.samples).get('median')} "
            f"({time.perf_counter() - t0:.1f}s)")
        out.append(m)
    return out


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def _events_time_ms(fn: Callable[[], None], iters: int) -> float:
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def _repeat(cfg: Config, fn: Callable[[], None], iters: int, work: float, warmup: int = 2) -> list[float]:
    """Samples of `work` per second (work per iteration / seconds per iteration)."""
    for _ in range(warmup):
        fn()
    import torch

    torch.cuda.synchronize()
    return [work / (_events_time_ms(fn, iters) / 1e3 / iters) for _ in range(cfg.repeats)]


def _no_gpu(name: str) -> Metric:
    m = new(name)
    m.skipped = "no CUDA device"
    return m


def gemm(cfg: Config, cuda: bool) -> Metric:
    if not cuda:
        return _no_gpu("gemm_bf16_tflops")
    import torch

    n = 2048 if cfg.quick else 8192
    m = new("gemm_bf16_tflops", n=n, dtype="bfloat16")
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    m.samples = [x / 1e12 for x in _repeat(cfg, lambda: torch.matmul(a, b, out=c), 20, 2.0 * n**3, 5)]
    return m


def device_copy(cfg: Config, cuda: bool) -> Metric:
    if not cuda:
        return _no_gpu("device_copy_tbps")
    import torch

    nbytes = (256 if cfg.quick else 2048) << 20
    m = new("device_copy_tbps", bytes=nbytes)
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").fill_(1)
    dst = torch.empty_like(src)
    m.samples = [x / 1e12 for x in _repeat(cfg, lambda: dst.copy_(src), 20, 2.0 * nbytes)]
    return m


def _transfer(name: str, cfg: Config, cuda: bool, to_device: bool, pinned: bool) -> Metric:
    if not cuda:
        return _no_gpu(name)
    import torch

    nbytes = (64 if cfg.quick else 512) << 20
    m = new(name, bytes=nbytes, pinned=pinned)
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned)
    host.fill_(1)
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    fn = (lambda: dev.copy_(host, non_blocking=pinned)) if to_device else (
        lambda: host.copy_(dev, non_blocking=pinned))
    m.samples = [x / 1e9 for x in _repeat(cfg, fn, 5, float(nbytes))]
    return m


def launch(name: str, cfg: Config, cuda: bool, graph: bool) -> Metric:
    """Per-kernel time of 100 tiny kernels (an add on one element): eager, or one graph replay."""
    if not cuda:
        return _no_gpu(name)
    import torch

    k = 100
    m = new(name, kernels_per_sample=k)
    x = torch.zeros(1, device="cuda")

    def body() -> None:
        for _ in range(k):
            x.add_(1.0)

    fn = body
    if graph:
        from tuner.workloads.graphs import capture

        g, _ = capture(body)
        fn = g.replay
    # samples in kernels per second -> us per kernel
    m.samples = [1e6 / x for x in _repeat(cfg, fn, 20, float(k), warmup=3)]
    return m


def nccl_allreduce(cfg: Config, cuda: bool, backend: str = "nccl", world: int | None = None) -> Metric:
    """Bus bandwidth of an all-reduce over every GPU (nccl-tests' busbw = algbw * 2(n-1)/n).
    Runs one rank process per GPU, NVLink multicast off (tuner.workloads.collectives);
    `backend="gloo"` runs the same code on CPUs (tests)."""
    name = "nccl_allreduce_busbw_gbps"
    if backend == "nccl":
        if not cuda:
            return _no_gpu(name)
        import torch

        world = torch.cuda.device_count()
        if world < 2:
            m = new(name)
            m.skipped = "needs 2 or more GPUs (1 found)"
            return m
    world = world or 2
    from tuner.workloads.allreduce import allreduce_busbw

    nbytes = (4 if cfg.quick or backend != "nccl" else 256) << 20
    m = new(name, bytes=nbytes, world=world, backend=backend)
    m.samples = allreduce_busbw([nbytes], world, backend, repeats=cfg.repeats,
                                iters=None if backend == "nccl" else 3)[nbytes]
    return m


def host_mem_bw(cfg: Config, cuda: bool) -> Metric:
    """Host memory copy (numpy), single thread: bytes read + written per second."""
    import numpy as np

    nbytes = (64 if cfg.quick else 1024) << 20
    m = new("host_mem_bw_gbps", bytes=nbytes, threads=1)
    a = np.ones(nbytes, dtype=np.uint8)
    b = np.empty_like(a)
    np.copyto(b, a)
    for _ in range(cfg.repeats):
        t0 = time.perf_counter()
        np.copyto(b, a)
        m.samples.append(2.0 * nbytes / (time.perf_counter() - t0) / 1e9)
    return m


def decode(cfg: Config, cuda: bool, graphs: bool = True) -> Metric:
    """Holistic decode tokens/s from the project's Llama-style workload (issue 6)."""
    from tuner.compare import holistic

    return holistic.measure(new("decode_tok_s" if graphs else "decode_eager_tok_s"), cfg, cuda, graphs)


_BENCHES: dict[str, Callable[[Config, bool], Metric]] = {
    "gemm_bf16_tflops": gemm,
    "device_copy_tbps": device_copy,
    "h2d_pinned_gbps": lambda c, g: _transfer("h2d_pinned_gbps", c, g, True, True),
    "d2h_pinned_gbps": lambda c, g: _transfer("d2h_pinned_gbps", c, g, False, True),
    "h2d_pageable_gbps": lambda c, g: _transfer("h2d_pageable_gbps", c, g, True, False),
    "d2h_pageable_gbps": lambda c, g: _transfer("d2h_pageable_gbps", c, g, False, False),
    "launch_eager_us": lambda c, g: launch("launch_eager_us", c, g, False),
    "launch_graph_us": lambda c, g: launch("launch_graph_us", c, g, True),
    "nccl_allreduce_busbw_gbps": nccl_allreduce,
    "host_mem_bw_gbps": host_mem_bw,
    "decode_tok_s": decode,
    "decode_eager_tok_s": lambda c, g: decode(c, g, graphs=False),
    "decode_tok_per_j": lambda c, g: _decode_energy(c, g),
}


def _decode_energy(cfg: Config, cuda: bool) -> Metric:
    from tuner.compare import holistic

    return holistic.measure_energy(new("decode_tok_per_j"), cfg, cuda)

os.environ.setdefault("CUDA_MODULE_LOADING", "LAZY")
