"""Health monitors: small sources of incidents (see base.Monitor)."""
from __future__ import annotations

import os
from typing import Any, Iterable, Optional

from safety.monitors.base import Monitor
from safety.monitors.canary import CanaryMonitor
from safety.monitors.clocks import ClockEventMonitor, ThermalMonitor
from safety.monitors.ecc import EccMonitor
from safety.monitors.kmsg import KmsgXidMonitor
from safety.monitors.pcie import AerMonitor, PcieReplayMonitor
from safety.monitors.xid import NvmlXidMonitor

__all__ = ["Monitor", "NvmlXidMonitor", "KmsgXidMonitor", "EccMonitor", "PcieReplayMonitor",
           "AerMonitor", "ClockEventMonitor", "ThermalMonitor", "CanaryMonitor", "standard"]


def standard(nvml: Any = None, root: str | os.PathLike[str] = "/",
             gpus: Optional[Iterable[int]] = None, bdfs: Optional[Iterable[str]] = None,
             canary: Optional[CanaryMonitor] = None) -> list[Monitor]:
    """The usual set for a host: every NVML monitor when `nvml` is given, the kernel log and
    AER counters under `root`, and the canary if one is given."""
    ms: list[Monitor] = []
    if nvml is not None:
        g = list(gpus) if gpus is not None else None
        ms += [NvmlXidMonitor(nvml, g), EccMonitor(nvml, g), PcieReplayMonitor(nvml, g),
               ClockEventMonitor(nvml, g), ThermalMonitor(nvml, g)]
    ms += [KmsgXidMonitor(root), AerMonitor(root, bdfs)]
    if canary is not None:
        ms.append(canary)
    return ms
