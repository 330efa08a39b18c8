"""Clock event reasons (HW slowdown 0x8, HW thermal slowdown 0x40, HW power brake 0x80) and GPU
temperature against the device's own slowdown threshold. Both report rising edges, and never a
condition that was already there when the monitor was armed: a host whose incumbent setting already
throttles does not blame that on the change under probation (or on an A/B switch back to it)."""
from __future__ import annotations

from typing import Any, Iterable, Optional

from safety.incident import Incident
from safety.monitors.base import NvmlMonitor

HW_SLOWDOWN, HW_THERMAL, HW_POWER_BRAKE = 0x8, 0x40, 0x80
NAMES = {HW_SLOWDOWN: "HW slowdown", HW_THERMAL: "HW thermal slowdown",
         HW_POWER_BRAKE: "HW power brake slowdown"}


class ClockEventMonitor(NvmlMonitor):
    name = "clock_events"

    def __init__(self, nvml: Any, gpus: Optional[Iterable[int]] = None,
                 mask: int = HW_SLOWDOWN | HW_THERMAL | HW_POWER_BRAKE):
        super().__init__(nvml, gpus)
        self.mask = mask
        self._last: dict[int, int] = {}
        self._armed: dict[int, int] = {}

    def _reasons(self, h: Any) -> Optional[int]:
        r = self.query("nvmlDeviceGetCurrentClocksEventReasons", h)
        if r is None:  # drivers before 535 call them throttle reasons
            r = self.query("nvmlDeviceGetCurrentClocksThrottleReasons", h)
        return None if r is None else int(r)

    def arm(self) -> None:
        self._last = {i: (self._reasons(h) or 0) & self.mask for i, h in self.handles().items()}
        self._armed = dict(self._last)

    def poll(self) -> list[Incident]:
        out = []
        for i, h in self.handles().items():
            r = self._reasons(h)
            if r is None:
                continue
            cur = r & self.mask
            new = cur & ~self._last.get(i, 0) & ~self._armed.get(i, 0)
            self._last[i] = cur
            if new:
                names = ", ".join(n for b, n in NAMES.items() if new & b)
                typ = "thermal" if new & HW_THERMAL else "clock_event"
                out.append(self.incident(typ, "fatal", f"clocks held back: {names}"
                                         f" (reasons 0x{r:x})", gpu=str(i), data={"reasons": r}))
        return out


class ThermalMonitor(NvmlMonitor):
    name = "thermal"

    def __init__(self, nvml: Any, gpus: Optional[Iterable[int]] = None, margin_c: int = 0):
        super().__init__(nvml, gpus)
        self.margin_c = margin_c
        self._thr: dict[int, Optional[int]] = {}
        self._hot: dict[int, bool] = {}
        self._hot_at_arm: dict[int, bool] = {}

    def arm(self) -> None:
        slow = self.const("NVML_TEMPERATURE_THRESHOLD_SLOWDOWN", 1)
        for i, h in self.handles().items():
            self._thr[i] = self.query("nvmlDeviceGetTemperatureThreshold", h, slow)
            self._hot[i] = self._is_hot(i, h)[0]
        self._hot_at_arm = dict(self._hot)

    def _is_hot(self, i: int, h: Any) -> tuple[bool, Optional[int]]:
        thr = self._thr.get(i)
        if thr is None:
            return False, None
        t = self.query("nvmlDeviceGetTemperature", h, self.const("NVML_TEMPERATURE_GPU", 0))
        return (t is not None and t >= thr - self.margin_c), t

    def poll(self) -> list[Incident]:
        out = []
        for i, h in self.handles().items():
            hot, t = self._is_hot(i, h)
            if hot and not self._hot.get(i) and not self._hot_at_arm.get(i):
                out.append(self.incident("thermal", "fatal", f"GPU at {t} C, slowdown threshold"
                                         f" {self._thr[i]} C", gpu=str(i),
                                         data={"temp_c": t, "slowdown_c": self._thr[i]}))
            self._hot[i] = hot
        return out
