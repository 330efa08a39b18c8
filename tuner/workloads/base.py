"""The Workload interface and the arithmetic every workload shares.

A workload measures something where higher is better (tokens/s, requests/s) and returns a
`tuner.trial.Measurement`: the headline value (median of repeats), the repeats themselves, and for
workloads with several sizes (context lengths, batch sizes) the per-size medians, so the keep rule
can refuse a candidate that trades one size for another (tuner.search.keep).

Multi-size headline: the geometric mean over sizes of each repeat's per-size values. A geometric
mean weighs a 10% change at any size the same, whatever that size's absolute tokens/s.
"""
from __future__ import annotations

import statistics
from typing import Any, Mapping, Optional, Protocol, Sequence, runtime_checkable

from tuner.trial import Measurement
from tuner.workloads.stats import geomean, rel_spread

__all__ = ["Workload", "geomean", "rel_spread", "summarize"]


@runtime_checkable
class Workload(Protocol):
    """Something that measures. Runtime settings of a candidate (Candidate.runtime, e.g.
    {"cuda_graphs": false}) are handed to `configure` before `measure`.

    A protocol, so a workload need not import this module to be one: llama.py stays free of
    pydantic (it also runs on bare GPU machines) and satisfies it as it is."""

    name: str = "workload"

    def configure(self, runtime: Mapping[str, Any]) -> None:
        """Apply a candidate's runtime settings; workloads without any ignore them."""

    def measure(self, repeats: int = 5, timeout_s: Optional[float] = None) -> Measurement:
        """Run `repeats` times; return the metric with its samples (and per-size results)."""
        ...


def summarize(metric: str, unit: str, per_size_samples: Mapping[str, Sequence[float]],
              extra: Optional[dict[str, Any]] = None) -> Measurement:
    """Build a Measurement from per-size repeat lists (all of the same length).

    samples[i] is the geometric mean over sizes of repeat i, value their median, per_size the
    per-size medians; the raw per-size samples and spreads go to `extra`."""
    if not per_size_samples:
        raise ValueError("no sizes measured")
    n = min(len(v) for v in per_size_samples.values())
    if n == 0:
        raise ValueError("a size has no samples")
    samples = [geomean([v[i] for v in per_size_samples.values()]) for i in range(n)]
    ex: dict[str, Any] = dict(extra or {})
    ex["per_size_samples"] = {k: list(v) for k, v in per_size_samples.items()}
    ex["per_size_spread"] = {k: rel_spread(v) for k, v in per_size_samples.items()}
    ex["spread"] = rel_spread(samples)
    return Measurement(
        metric=metric, unit=unit, value=statistics.median(samples), samples=samples,
        per_size={k: statistics.median(v) for k, v in per_size_samples.items()}, extra=ex,
    )

