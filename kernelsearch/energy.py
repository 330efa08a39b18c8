"""Energy over a window of GPU work, read only from NVML (nothing is ever written to the GPU).

`EnergyMeter(device_index)` is a context manager (or `start()` / `stop()`) whose reading holds the
joules the board used over the window and their mean watts:

1. `nvmlDeviceGetTotalEnergyConsumption` (mJ since the driver loaded; Volta and later) read at
   both ends, the difference taken modulo the counter's 64 bits so a wrap-around between the
   reads is a small positive delta; a counter that went backwards by more than a wrap explains
   (a driver reload) is refused rather than read as a huge number;
2. where the counter is not supported: `nvmlDeviceGetPowerUsage` (mW) sampled on a thread at a
   bounded rate (1-20 Hz) and at both ends, integrated with the trapezoid rule over the samples'
   own timestamps (on recent boards the power reading is itself averaged over ~1 s, so a window
   well under a second is an estimate); a sample that no board can draw (not a number, negative,
   over MAX_BOARD_W: 0xFFFFFFFF mW = 4.29 MW is NVML's "invalid") makes the window unmeasured,
   with the reading named in the reason, never a number;
3. otherwise `Reading.joules is None` with the reason (no pynvml, no GPU, neither call supported).

Only read calls are made: nvmlInit / nvmlShutdown, nvmlDeviceGetHandleByIndex and the two above.
`pynvml` (nvidia-ml-py) is optional and imported lazily; tests pass a fake with the same
function names and exception classes (`nvml=`).
"""
from __future__ import annotations

import math
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Optional

COUNTER_MOD = 1 << 64  # nvmlDeviceGetTotalEnergyConsumption is an unsigned long long, in mJ
MAX_BOARD_W = 5000.0  # no board draws more: a larger delta is a reset counter, not energy
MIN_HZ, MAX_HZ = 1.0, 20.0  # the board averages its power reading over ~1 s anyway

SOURCE_COUNTER = "nvml_energy_counter"
SOURCE_SAMPLES = "nvml_power_samples"


@dataclass
class Reading:
    joules: Optional[float]  # None: not measured (`reason` says why)
    seconds: float
    source: str = ""  # SOURCE_COUNTER | SOURCE_SAMPLES | "" (not measured)
    reason: str = ""
    samples: int = 0  # power samples integrated (power-sample source)
    # what the meter costs the window: the caller's time in start()/stop() (NVML reads at the
    # ends) plus the sampler thread's CPU time (its reads and bookkeeping, on another core
    # except where it holds the GIL): an upper bound of what it takes from the work measured
    overhead_s: float = 0.0

    @property
    def mean_w(self) -> Optional[float]:
        if self.joules is None or self.seconds <= 0:
            return None
        return self.joules / self.seconds

    @property
    def overhead(self) -> float:
        """The meter's own time as a fraction of the window."""
        return self.overhead_s / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict:
        return dict(asdict(self), mean_w=self.mean_w, overhead=self.overhead)


def _load_nvml() -> Any:
    import pynvml  # nvidia-ml-py: optional

    return pynvml


class EnergyMeter:
    """Joules and mean watts of GPU `device_index` over a window (see the module docstring)."""

    def __init__(self, device_index: int = 0, nvml: Any = None, sample_hz: float = 10.0,
                 clock: Callable[[], float] = time.perf_counter, keep_open: bool = False):
        self.device_index = device_index
        # keep_open: NVML stays initialised between windows (nvmlInit can take milliseconds);
        # the owner calls close() when done. Otherwise each stop() shuts it down.
        self.keep_open = keep_open
        self._opened = False
        self._open_reason = ""
        self.sample_hz = min(MAX_HZ, max(MIN_HZ, float(sample_hz)))
        self._nvml = nvml
        self._clock = clock
        self._handle: Any = None
        self._inited = False
        self._reason = ""
        self._t0 = 0.0
        self._e0: Optional[int] = None
        self._samples: list[tuple[float, float]] = []  # (time, watts)
        self._impossible: list[float] = []  # samples no board can draw
        self._overhead = 0.0
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.reading: Optional[Reading] = None

    # -- the window --------------------------------------------------------------------------
    def start(self) -> "EnergyMeter":
        self.reading, self._reason, self._e0, self._samples = None, "", None, []
        self._impossible = []
        self._overhead = 0.0
        t = self._clock()
        if not self._opened:
            self._open()
        if self._handle is not None:
            self._e0 = self._counter()
            if self._e0 is None and self._sample() is not None:
                self._stop.clear()
                self._thread = threading.Thread(target=self._run, name="energy-sampler",
                                                daemon=True)
                self._thread.start()
        self._overhead += self._clock() - t
        self._t0 = self._clock()
        return self

    def stop(self) -> Reading:
        t1 = self._clock()
        seconds = t1 - self._t0
        try:
            if self._handle is None:
                r = Reading(None, seconds, reason=self._open_reason)
            elif self._e0 is not None:
                r = self._from_counter(seconds)
            elif self._thread is not None:
                self._stop.set()
                self._thread.join()
                self._thread = None
                self._sample()
                r = self._from_samples(seconds)
                # why it sampled (the counter's error), after why it gave nothing, if it did not
                r.reason = "; ".join(x for x in (r.reason, self._reason.lstrip("; ")) if x)
            else:
                r = Reading(None, seconds, reason=self._reason.lstrip("; ") or "no reading")
        finally:
            if not self.keep_open:
                self.close()
        r.overhead_s = self._overhead + (self._clock() - t1)
        self.reading = r
        return r

    def __enter__(self) -> "EnergyMeter":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- NVML ----------------------------------------------------------------------------------
    def _open(self) -> None:
        self._opened = True
        try:
            if self._nvml is None:
                self._nvml = _load_nvml()
        except ImportError as e:
            self._open_reason = f"pynvml (nvidia-ml-py) is not installed: {e}"
            return
        try:
            self._nvml.nvmlInit()
            self._inited = True
            self._handle = self._nvml.nvmlDeviceGetHandleByIndex(self.device_index)
        except Exception as e:  # noqa: BLE001 - NVMLError_* (no driver, no such GPU) and the like
            self._handle = None
            self._open_reason = f"NVML unavailable for GPU {self.device_index}: {_why(e)}"

    def close(self) -> None:
        """Shut NVML down (a later start() initialises it again)."""
        self._opened = False
        if self._inited:
            self._inited = False
            try:
                self._nvml.nvmlShutdown()
            except Exception:  # noqa: BLE001 - the reading is taken; nothing to undo
                pass
        self._handle = None

    def _counter(self) -> Optional[int]:
        try:
            return int(self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle))
        except Exception as e:  # noqa: BLE001 - NVMLError_NotSupported before Volta, in some VMs
            self._reason = f"nvmlDeviceGetTotalEnergyConsumption: {_why(e)}"
            return None

    def _sample(self) -> Optional[float]:
        t = self._clock()
        try:
            w = float(self._nvml.nvmlDeviceGetPowerUsage(self._handle)) / 1000.0
        except Exception as e:  # noqa: BLE001 - NVMLError_NotSupported
            self._reason += f"; nvmlDeviceGetPowerUsage: {_why(e)}"
            return None
        t1 = self._clock()
        if not possible_w(w):
            self._impossible.append(w)
            return w  # counted, never integrated: the window is unmeasured
        self._samples.append(((t + t1) / 2, w))
        return w

    def _run(self) -> None:
        c0 = time.thread_time()
        period = 1.0 / self.sample_hz
        while not self._stop.wait(period):
            self._sample()
        self._overhead += time.thread_time() - c0  # read after join() by stop()

    def _from_counter(self, seconds: float) -> Reading:
        e1 = self._counter()
        if e1 is None:
            return Reading(None, seconds, reason=self._reason)
        delta_mj = (e1 - self._e0) % COUNTER_MOD  # a wrap between the reads: still the delta
        if delta_mj / 1000.0 > MAX_BOARD_W * max(seconds, 1e-3):
            return Reading(None, seconds, reason=f"energy counter went from {self._e0} to {e1} "
                           "mJ: reset (driver reload?), not a wrap-around")
        return Reading(delta_mj / 1000.0, seconds, SOURCE_COUNTER)

    def _from_samples(self, seconds: float) -> Reading:
        if self._impossible:
            return Reading(None, seconds, reason=f"impossible power reading {self._impossible[0]!r} W "
                           f"(outside 0-{MAX_BOARD_W:g} W; {len(self._impossible)} of "
                           f"{len(self._impossible) + len(self._samples)} samples)")
        s = sorted(self._samples)
        if len(s) < 2:
            return Reading(None, seconds, reason="fewer than two power samples")
        span = s[-1][0] - s[0][0]
        if span <= 0:
            return Reading(None, seconds, reason="power samples span no time")
        area = sum((t1 - t0) * (w0 + w1) / 2 for (t0, w0), (t1, w1) in zip(s, s[1:]))
        # the samples' span is a little shorter than the window: the mean over it, for all of it
        return Reading(area / span * seconds, seconds, SOURCE_SAMPLES, samples=len(s))


def possible_w(w: Any) -> bool:
    """Whether `w` watts is a reading a board can give: a finite number in [0, MAX_BOARD_W]."""
    return isinstance(w, (int, float)) and math.isfinite(w) and 0.0 <= w <= MAX_BOARD_W


def _why(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"[:200]


def measure(fn: Callable[[], Any], meter: Optional[EnergyMeter] = None) -> tuple[Any, Reading]:
    """fn's result and the energy reading over its call."""
    m = meter or EnergyMeter()
    with m:
        out = fn()
    assert m.reading is not None
    return out, m.reading
