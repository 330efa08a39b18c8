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
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Protocol, Sequence, runtime_checkable

from tuner.errors import WorkloadFailed
from tuner.trial import Measurement
from tuner.workloads.stats import geomean, rel_spread

__all__ = ["KernelCall", "Served", "Tunable", "Untuned", "Workload", "geomean", "install_here", "rel_spread",
           "summarize"]

#: one kernel call a workload makes: (family, dtype, shape)
KernelCall = tuple[str, str, tuple[int, ...]]


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


@runtime_checkable
class Tunable(Workload, Protocol):
    """Everything a mixed search (tuner.search.mixed) asks of a workload, declared rather than
    probed. `HolisticWorkload` implements it for the models in this folder; a workload with
    nothing to tune but the host takes `Untuned`'s answers."""

    #: where its kernels run ("cpu" or "cuda"): the judge times candidates there
    device: str
    #: the isolated micro-benchmark a runtime change could be judged by (seconds to the first
    #: decode step, setup included); None: the workload has none
    first_step_s: Optional[Callable[[], float]]

    def runtime_dims(self) -> dict[str, list[Any]]:
        """The runtime settings a search may change, each over the values it tries ({}: none)."""
        ...

    def runtime_settings(self) -> dict[str, Any]:
        """The runtime settings in force (the incumbent's)."""
        ...

    def validate_runtime(self, runtime: Mapping[str, Any]) -> Any:
        """Raise ValueError (naming the key) for settings this workload cannot take."""
        ...

    def kernels_usable(self) -> Optional[str]:
        """Why its kernel calls cannot take table kernels here (None: they can)."""
        ...

    def kernel_calls(self) -> dict[KernelCall, int]:
        """Every (family, dtype, shape) its call path dispatches, with the number of calls."""
        ...

    def kernel_variants(self) -> Optional[Mapping[str, Sequence[str]]]:
        """Per family, the only variants its call path runs (None: any of the family's)."""
        ...

    #: whether a table naming stored (candidate) sources can be installed where its kernels run:
    #: only in a model process (tuner.workloads.model_process), never in the search's (root)
    #: process; a search offers stored sources as kernel choices only then
    runs_stored_sources: bool

    def install_table(self, table: Any, store_dir: Optional[Path] = None) -> None:
        """Install the dispatch table `table` where its kernels run (`store_dir`: the stored
        sources it names); WorkloadFailed for a table it cannot take there."""
        ...

    def dispatch_changed(self) -> None:
        """The installed dispatch table changed: drop what holds the old table's kernels."""
        ...

    def check(self) -> Optional[dict[str, Any]]:
        """The candidate path's outputs against the plain path ({"ok": ...}); None: no check."""
        ...

    def close(self) -> None:
        """Release what it started (rank processes)."""
        ...


@runtime_checkable
class Served(Tunable, Protocol):
    """What a model process's server (tuner.workloads.model_server) asks of the workload it
    holds, on top of Tunable: `HolisticWorkload` implements it for the models in this folder,
    `Untuned` answers for a workload without sizes to time or outputs to check."""

    #: whether a measurement first checks the candidate path's outputs (`check`)
    check_outputs: bool

    def timing(self) -> Optional[dict[str, Any]]:
        """What the model process's parent checks a measurement's tokens/s against with its own
        clock: {"decode_steps": N, "sizes": [[kind, batch, ctx], ...]}; None: not checked."""
        ...

    def prepare(self) -> None:
        """Set up everything a measurement would first (its output check, every size's runner:
        compiled, captured), so that the `measure` timed next times runs only."""
        ...


class Untuned:
    """The Tunable answers of a workload with nothing to tune but the host (the simulated
    host's model, a user's command): no runtime settings, no kernel calls."""

    device = "cpu"
    first_step_s: Optional[Callable[[], float]] = None
    check_outputs = False

    def timing(self) -> Optional[dict[str, Any]]:
        return None

    def prepare(self) -> None:
        pass  # nothing set up ahead of a measurement
    NO_KERNELS = "kernel slots need the llama, sim-llama, deepseek or hf:<config> workload"

    def configure(self, runtime: Mapping[str, Any]) -> None:
        pass  # nothing to configure: validate_runtime refuses any setting before it gets here

    def runtime_dims(self) -> dict[str, list[Any]]:
        return {}

    def runtime_settings(self) -> dict[str, Any]:
        return {}

    def validate_runtime(self, runtime: Mapping[str, Any]) -> Any:
        if runtime:
            raise ValueError(f"runtime {sorted(runtime)}: this workload has no runtime settings")
        return {}

    def kernels_usable(self) -> Optional[str]:
        return self.NO_KERNELS

    def kernel_calls(self) -> dict[KernelCall, int]:
        return {}

    def kernel_variants(self) -> Optional[Mapping[str, Sequence[str]]]:
        return None

    runs_stored_sources = False

    def install_table(self, table: Any, store_dir: Optional[Path] = None) -> None:
        install_here(self, table, store_dir)

    def dispatch_changed(self) -> None:
        pass

    def check(self) -> Optional[dict[str, Any]]:
        return None

    def close(self) -> None:
        pass


def install_here(workload: Any, table: Any, store_dir: Optional[Path] = None) -> None:
    """`install_table` of a workload whose kernels run in this (the search's, maybe root)
    process: shipped variants only, a stored source is never imported here."""
    from kernelsearch import dispatch

    if table.sources():
        raise WorkloadFailed(f"{workload.name}: runs in the search's process, and a table naming "
                             "stored sources is installed only in a model process (its workload "
                             "registered with model_process)")
    dispatch.install(table, store=store_dir)


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

