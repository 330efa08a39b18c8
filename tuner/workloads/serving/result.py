"""The bench client's result dicts as a Measurement: one size per concurrency level (`c=N`),
per size output tok/s (the headline, with its repeats in extra["per_size_samples"]) and goodput
(requests/s meeting the SLOs, repeats in extra["per_size_goodput_samples"]), the latency
percentiles, and tokens per joule where the energy was measured."""
from __future__ import annotations

import statistics
from typing import Any, Mapping, Optional, Sequence

from tuner.trial import Measurement
from tuner.workloads.base import summarize

LATENCIES = ("ttft", "tpot", "itl", "e2el")
STATS = ("mean", "p50", "p99")


def size(concurrency: int) -> str:
    return f"c={concurrency}"


def to_measurement(runs: Sequence[Mapping[str, Any]], extra: Optional[dict[str, Any]] = None,
                   watts: Optional[Mapping[str, float]] = None, energy_source: str = "") -> Measurement:
    """`runs`: the client's dicts, each with "concurrency"; `watts`: mean board watts per size
    over its window (None/empty: energy not measured)."""
    tput: dict[str, list[float]] = {}
    good: dict[str, list[float]] = {}
    lat: dict[str, dict[str, list[float]]] = {}
    for r in runs:
        k = size(int(r["concurrency"]))
        tput.setdefault(k, []).append(float(r["output_throughput"]))
        good.setdefault(k, []).append(float(r.get("request_goodput") or 0.0))
        for m in LATENCIES:
            for s in STATS:
                v = r.get(f"{s}_{m}_ms")
                if v is not None:
                    lat.setdefault(k, {}).setdefault(f"{s}_{m}_ms", []).append(float(v))
    ex = dict(extra or {})
    ex["per_size_goodput_samples"] = good
    ex["latency_ms"] = {k: {f: statistics.median(v) for f, v in d.items()} for k, d in lat.items()}
    ex["latency_samples_ms"] = lat
    ex["completed"] = {k: sum(int(r["completed"]) for r in runs if size(int(r["concurrency"])) == k)
                       for k in tput}
    ex["failed"] = {k: sum(int(r.get("failed") or 0) for r in runs if size(int(r["concurrency"])) == k)
                    for k in tput}
    m = summarize("output_tok_s", "tok/s", tput, ex)
    m.per_size_goodput = {k: statistics.median(v) for k, v in good.items()}
    if watts:
        m.per_size_watts = {k: w for k, w in watts.items() if k in m.per_size and w > 0}
        m.per_size_tok_per_j = {k: m.per_size[k] / w for k, w in m.per_size_watts.items()}
        m.energy_source = energy_source if m.per_size_watts else ""
    return m
