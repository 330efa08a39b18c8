"""The serving rows of `compare --serving vllm:...`: the serving workload (tuner.workloads.serving)
measured on the target, its per-size goodput, output tok/s, p99 latencies and tokens/J as suite
Metrics with every repeat kept, so the report gives each a spread and a ratio with its interval.
Imported by the compare child only when a serving config is given: it needs pydantic, which
the plain suite does not."""
from __future__ import annotations

from typing import Any, Callable

from tuner.compare.suite import Metric

#: (metric name prefix, unit, higher is better, what it reads)
ROWS = [
    ("serving_goodput_rps", "req/s", True, "goodput"),
    ("serving_output_tok_s", "tok/s", True, "tput"),
    ("serving_ttft_p99_ms", "ms", False, "p99_ttft_ms"),
    ("serving_tpot_p99_ms", "ms", False, "p99_tpot_ms"),
    ("serving_itl_p99_ms", "ms", False, "p99_itl_ms"),
    ("serving_e2el_p99_ms", "ms", False, "p99_e2el_ms"),
]


def metrics(args: str, repeats: int, log: Callable[[str], None]) -> list[Metric]:
    """One Metric per row and ladder size (`serving_goodput_rps@c=4`), tokens/J where the target
    measured energy; one Metric with the error when the engine could not be measured."""
    from tuner.errors import MetaltuneError
    from tuner.workloads.serving.config import load
    from tuner.workloads.serving.workload import ServingWorkload

    wl = ServingWorkload(load(args))
    try:
        m = wl.measure(repeats=repeats)
    except MetaltuneError as e:
        err = Metric("serving_goodput_rps", "req/s", True, params={"workload": f"vllm:{args}"})
        err.error = f"{type(e).__name__}: {str(e)[:800]}"
        return [err]
    finally:
        wl.close()
    params: dict[str, Any] = {"engine": m.extra["engine"], "settings": m.extra["settings"],
                              "bench": m.extra["bench"]}
    out = []
    for size in m.per_size:
        for name, unit, hib, field in ROWS:
            if field == "goodput":
                samples = m.extra["per_size_goodput_samples"][size]
            elif field == "tput":
                samples = m.extra["per_size_samples"][size]
            else:
                samples = m.extra["latency_samples_ms"].get(size, {}).get(field, [])
            out.append(Metric(f"{name}@{size}", unit, hib, list(samples), params={**params, "size": size}))
        if size in m.per_size_tok_per_j:  # one window per size: its repeats share it
            out.append(Metric(f"serving_tok_per_j@{size}", "tok/J", True, [m.per_size_tok_per_j[size]],
                              params={**params, "size": size, "energy_source": m.energy_source}))
    log(f"serving: {len(out)} rows over {list(m.per_size)}")
    return out
