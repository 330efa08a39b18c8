"""The Workload interface and the arithmetic every workload shares.

A workload measures something where higher is better (tokens/s, requests/s) and returns a
`tuner.trial.Measurement`: the headline value (median of repeats), the repeats themselves, and for
workloads with several sizes (context lengths, batch sizes) the per-size medians, so the keep rule
can refuse a candidate that trades one size for another (tuner.holistic).

Multi-size headline: the geometric mean over sizes of each repeat's per-size values. A geometric
mean weighs a 10% change at any size the same, whatever that size's absolute tokens/s.
"""
from __future__ import annotations

import statistics
from abc import ABC, abstractmethod
from typing import Any, Mapping, Optional, Sequence

from tuner.trial import Measurement
from tuner.workloads.stats import geomean, rel_spread

__all__ = ["Workload", "geomean", "rel_spread", "summarize"]


class Workload(ABC):
    """Something that measures. Runtime settings of a candidate (Candidate.runtime, e.g.
    {"cuda_graphs": false}) are handed to `configure` before `measure`."""

    name: str = "workload"

    def configure(self, runtime: Mapping[str, Any]) -> None:  # noqa: B027 (optional hook)
        """Apply a candidate's runtime settings; workloads without any ignore them."""

    @abstractmethod
    def measure(self, repeats: int = 5, timeout_s: Optional[float] = None) -> Measurement:
        """Run `repeats` times; return the metric with its samples (and per-size results)."""


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


def _register_builtin() -> None:
    # llama.py stays free of pydantic (it also runs on bare GPU machines), so it cannot
    # subclass Workload; it is registered as a virtual subclass instead
    from tuner.workloads.llama import LlamaWorkload

    Workload.register(LlamaWorkload)


_register_builtin()
