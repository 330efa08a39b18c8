"""Energy beside throughput in the holistic workloads (Llama, DeepSeek, HF): per size, the board's
mean watts over the window its tokens/s samples were timed in (kernelsearch.energy: NVML's
total-energy counter, else integrated power samples; read only), and tokens per joule
= tokens/s / watts. On a GPU only; on the CPU nothing is measured (energy_source "").

A window shorter than MIN_WINDOW_S is topped up with more of the same steps before it is read:
NVML's counter moves in steps of milliseconds to tens of them, too coarse for a window of a few
decode steps. The top-up adds time only to sizes whose timed repeats were that short.
METALTUNE_ENERGY_WINDOW_S sets a longer window: on the H200 a board's draw swung 470-535 W
between 0.5 s windows of the same kernels (issue 34's run), so a replay that compares energy
takes seconds a window."""
from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Optional

from kernelsearch.energy import possible_w

MIN_WINDOW_S = 0.5
WINDOW_ENV = "METALTUNE_ENERGY_WINDOW_S"


def min_window_s() -> float:
    """The least window a size's energy is read over: MIN_WINDOW_S, or the environment's value
    (0.1 to 60 s; anything else keeps the default: a measurement is no place for a usage error)."""
    import os

    try:
        v = float(os.environ.get(WINDOW_ENV, ""))
    except ValueError:
        return MIN_WINDOW_S
    return v if 0.1 <= v <= 60.0 else MIN_WINDOW_S


def meter_for(device: Any) -> Any:
    """A kept-open EnergyMeter for a CUDA device, None elsewhere (tests replace this)."""
    if getattr(device, "type", "cpu") != "cuda":
        return None
    from kernelsearch.energy import EnergyMeter

    import torch

    index = device.index if device.index is not None else torch.cuda.current_device()
    return EnergyMeter(int(index), keep_open=True)


class SizeEnergy:
    """The energy windows of one `time_sizes` call: `window(key, step, device)` around a size's
    timed repeats; `fields(per_size)` the Measurement's energy fields and the extra record."""

    def __init__(self, device: Any):
        self.device = device
        self.meter = meter_for(device)
        self.readings: dict[str, Any] = {}

    def window(self, key: str, step: Callable[[], Any]) -> "_Window":
        return _Window(self, key, step)

    def close(self) -> None:
        if self.meter is not None:
            self.meter.close()

    def record(self, per_size: dict[str, float]) -> dict[str, Any]:
        """{"per_size_tok_per_j", "per_size_watts", "energy_source", "energy"} for the sizes
        measured (empty dicts and "" where nothing was)."""
        tpj: dict[str, float] = {}
        watts: dict[str, float] = {}
        sources = set()
        for key, r in self.readings.items():
            if r.mean_w and possible_w(r.mean_w) and key in per_size:
                watts[key] = r.mean_w
                tpj[key] = per_size[key] / r.mean_w
                sources.add(r.source)
        timed = sum(r.seconds for r in self.readings.values())
        info = {"windows_s": {k: r.seconds for k, r in self.readings.items()},
                "overhead": (sum(r.overhead_s for r in self.readings.values()) / timed
                             if timed else 0.0),
                "unmeasured": {k: r.reason or "impossible reading" for k, r in self.readings.items()
                               if not (r.mean_w and possible_w(r.mean_w))}}
        return {"per_size_tok_per_j": tpj, "per_size_watts": watts,
                # one source for the measurement: the weaker where sizes differ
                "energy_source": min(sources) if sources else "",
                "energy": info if self.readings else {}}


class _Window:
    def __init__(self, owner: SizeEnergy, key: str, step: Callable[[], Any]):
        self.owner, self.key, self.step = owner, key, step

    def __enter__(self) -> "_Window":
        if self.owner.meter is not None:
            self.owner.meter.start()
            self.t0 = time.perf_counter()
        return self

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        m = self.owner.meter
        if m is None:
            return
        if exc_type is not None:  # the run failed: close the window, record nothing
            m.stop()
            return
        least = min_window_s()
        while time.perf_counter() - self.t0 < least:
            self.step()
        _sync(self.owner.device)
        self.owner.readings[self.key] = m.stop()


def _sync(device: Any) -> None:
    if getattr(device, "type", "cpu") == "cuda":
        import torch

        torch.cuda.synchronize(device)


def apply(measurement: Any, record: Optional[dict[str, Any]]) -> Any:
    """Set a Measurement's energy fields from `SizeEnergy.record` (kept in extra["energy"])."""
    if record:
        measurement.per_size_tok_per_j = record["per_size_tok_per_j"]
        measurement.per_size_watts = record["per_size_watts"]
        measurement.energy_source = record["energy_source"]
        if record.get("energy"):
            measurement.extra["energy"] = record["energy"]
    return measurement


def medians(per_size_samples: dict[str, list[float]]) -> dict[str, float]:
    return {k: statistics.median(v) for k, v in per_size_samples.items() if v}
