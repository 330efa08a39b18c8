"""A fake `pynvml` for the energy meter: the nvidia-ml-py functions it calls (same names,
parameters, units and exception classes: pynvml.NVMLError(code) gives NVMLError_NotSupported),
over a scripted board drawing `watts` (a number or a function of the fake's clock).
Every call is recorded, so a test can show the meter never called anything but a read."""
from __future__ import annotations

import ctypes
import threading
import time
from typing import Any, Callable, Optional, Union

import pynvml


class FakeEnergyNVML:
    def __init__(self, watts: Union[float, Callable[[float], float]] = 300.0,
                 counter: bool = True, power: bool = True, start_mj: int = 0,
                 counter_mod: int = 1 << 64, latency_s: float = 0.0, init_error: Optional[int] = None):
        self._const = None if callable(watts) else float(watts)
        self._watts = watts if callable(watts) else (lambda t, w=float(watts): w)
        self.counter_ok, self.power_ok = counter, power
        self.start_mj, self.counter_mod = start_mj, counter_mod
        self.latency_s = latency_s  # a real NVML read takes some time
        self.init_error = init_error
        self.calls: list[str] = []
        self._lock = threading.Lock()
        self._t0 = time.perf_counter()
        self.inited = 0

    def _log(self, name: str) -> None:
        with self._lock:
            self.calls.append(name)
        t = time.perf_counter() + self.latency_s
        while time.perf_counter() < t:  # spin, holding the GIL: worse than ctypes, which drops it
            pass

    def now(self) -> float:
        return time.perf_counter() - self._t0

    def energy_j(self, t: float, steps: int = 2000) -> float:
        """The exact integral of watts over [0, t] (midpoint rule, fine steps)."""
        if self._const is not None:
            return self._const * t
        h = t / steps
        return sum(self._watts((i + 0.5) * h) for i in range(steps)) * h

    # -- the nvidia-ml-py functions --------------------------------------------------------
    def nvmlInit(self) -> None:
        self._log("nvmlInit")
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)
        self.inited += 1

    def nvmlShutdown(self) -> None:
        self._log("nvmlShutdown")
        self.inited -= 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        self._log("nvmlDeviceGetHandleByIndex")
        if index != 0:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return ctypes.c_void_p(0x1000)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        self._log("nvmlDeviceGetTotalEnergyConsumption")
        if not self.counter_ok:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return int(self.start_mj + self.energy_j(self.now()) * 1000) % self.counter_mod

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        self._log("nvmlDeviceGetPowerUsage")
        if not self.power_ok:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return int(self._watts(self.now()) * 1000)
