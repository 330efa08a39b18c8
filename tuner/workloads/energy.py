"""Energy beside throughput in the holistic workloads (Llama, DeepSeek, HF): per size, the board's
mean watts over the window its tokens/s samples were timed in (kernelsearch.energy: NVML's
total-energy counter, else integrated power samples; read only), and tokens per joule
= tokens/s / watts. On a GPU only; on the CPU nothing is measured (energy_source "").

A window shorter than MIN_WINDOW_S is topped up with more of the same steps before it is read:
NVML's counter moves in steps of milliseconds to tens of them, too coarse for a window of a few
decode steps. The top-up adds time only to sizes whose timed repeats were that short.
METALTUNE_ENERGY_WINDOW_S sets a longer window: on the H200 a board's draw swung 470-535 W
between 0.5 s windows of the same kernels (issue 34's run), so a replay that compares energy
takes seconds a window.

A model process's measurement gets the parent's own reading instead of its reply's
(`ParentWindow`, `replace_with_parents`: the section at the end)."""
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


# -- a model-process measurement: the parent's reading (issue 42, item 2) ----------------------
# The model process runs candidate code, so the watts and tokens/J in its reply can say anything:
# a candidate's process claiming 100 W was kept under a 600 W budget while its board drew 700 W.
# So the search's process reads NVML's energy counter itself (kernelsearch.energy.EnergyMeter,
# read only) around the `measure` request, the same window its clock checks the reply's tokens/s
# against (tuner.workloads.model_trust), and that reading replaces whatever the process reported:
# per size, the window's mean board watts, and tokens/J = the size's tokens/s / those watts. One
# window covers every size of the request (the parent cannot see where one size ends), so a
# size's watts are the request's mean. Where the parent reads nothing (no GPU, no NVML) the
# measurement has no energy, never the child's; the child's claim is kept beside it in
# extra["energy"]["reported"] for the record. On the simulated host the sim host's power model
# is the parent's reading (tuner.sim.llama_host, in the search's process).


def parent_meter(device: str) -> Any:
    """A kept-open EnergyMeter for the model process's CUDA device ("cuda", "cuda:N"), None
    elsewhere (tests replace this). NVML counts boards by their physical index: the model
    process's device index is taken as one (CUDA_VISIBLE_DEVICES is not remapped here)."""
    if not str(device).startswith("cuda"):
        return None
    from kernelsearch.energy import EnergyMeter

    _, _, idx = str(device).partition(":")
    return EnergyMeter(int(idx) if idx.isdigit() else 0, keep_open=True)


class ParentWindow:
    """`with ParentWindow(workload) as w:` around a request; `w.reading` after it (None: no meter).
    The workload's meter (for its `.device`) is made once and kept open until `close`."""

    def __init__(self, workload: Any):
        if not hasattr(workload, "_energy_meter"):
            workload._energy_meter = parent_meter(workload.device)
        self.meter, self.reading = workload._energy_meter, None

    def __enter__(self) -> "ParentWindow":
        if self.meter is not None:
            self.meter.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.meter is not None:
            self.reading = self.meter.stop()


def close_parent_meter(workload: Any) -> None:
    meter = getattr(workload, "_energy_meter", None)
    if meter is not None:
        meter.close()


def replace_with_parents(m: Any, reading: Optional[Any]) -> Any:
    """`m` (a Measurement from the model process) with its energy fields the parent's
    `reading` (a kernelsearch.energy.Reading, or None: not measured)."""
    reported = {"per_size_watts": dict(m.per_size_watts), "energy_source": m.energy_source}
    w = getattr(reading, "mean_w", None)
    ok = w is not None and possible_w(w) and w > 0
    m.per_size_watts = {k: w for k in m.per_size} if ok else {}
    m.per_size_tok_per_j = {k: v / w for k, v in m.per_size.items()} if ok else {}
    m.energy_source = reading.source if ok else ""
    info = dict(m.extra.get("energy") or {})
    info["reported"] = reported  # what the process said, not believed
    info["parent"] = reading.to_dict() if reading is not None else {"reason": "no meter here"}
    m.extra["energy"] = info
    m.extra.pop("per_board_watts", None)  # the process's claim too: one board, the parent's
    return m
