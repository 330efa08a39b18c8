"""PCIe link health: the NVML replay counter rate and the kernel's AER counters in sysfs.

Replays: DCGM alarms above about 31 replays per minute on a Gen5 x16 link; we count the replays
of the trailing minute, so a burst alarms at once and a trickle never does. AER: new fatal or
non-fatal errors are fatal incidents, new correctable errors a warning."""
from __future__ import annotations

import os
import time
from collections import deque
from pathlib import Path
from typing import Any, Iterable, Optional

from safety.incident import Incident
from safety.monitors.base import Monitor, NvmlMonitor, read_text

DCGM_REPLAY_PER_MIN = 31


class PcieReplayMonitor(NvmlMonitor):
    name = "pcie_replay"

    def __init__(self, nvml: Any, gpus: Optional[Iterable[int]] = None,
                 threshold_per_min: float = DCGM_REPLAY_PER_MIN, window_s: float = 60.0):
        super().__init__(nvml, gpus)
        self.threshold = threshold_per_min * window_s / 60.0
        self.window_s = window_s
        self._last: dict[int, Optional[int]] = {}
        self._hist: dict[int, deque] = {}

    def arm(self) -> None:
        for i, h in self.handles().items():
            self._last[i] = self.query("nvmlDeviceGetPcieReplayCounter", h)
            self._hist.setdefault(i, deque())

    def poll(self) -> list[Incident]:
        out, now = [], time.monotonic()
        for i, h in self.handles().items():
            cur = self.query("nvmlDeviceGetPcieReplayCounter", h)
            last = self._last.get(i)
            self._last[i] = cur
            if cur is None or last is None:
                continue
            hist = self._hist.setdefault(i, deque())
            if cur > last:
                hist.append((now, cur - last))
            while hist and hist[0][0] < now - self.window_s:
                hist.popleft()
            n = sum(d for _, d in hist)
            if n > self.threshold:
                out.append(self.incident(
                    "pcie_replay", "fatal", f"{n} PCIe replays in the last {self.window_s:g}s"
                    f" (threshold {self.threshold:g})", gpu=str(i), data={"replays": n}))
                hist.clear()  # one alarm per burst
        return out


AER_FILES = {"fatal": "aer_dev_fatal", "nonfatal": "aer_dev_nonfatal",
             "correctable": "aer_dev_correctable"}


def parse_aer(text: Optional[str]) -> Optional[int]:
    """Total of an aer_dev_* file: its TOTAL_ERR_* line, else the sum of its counters (a file
    holding one number also works)."""
    if text is None:
        return None
    total, seen = 0, False
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        try:
            v = int(parts[-1])
        except ValueError:
            continue
        if parts[0].startswith("TOTAL_ERR"):
            return v
        total, seen = total + v, True
    return total if seen else None


class AerMonitor(Monitor):
    name = "aer"

    def __init__(self, root: str | os.PathLike[str] = "/", bdfs: Optional[Iterable[str]] = None):
        self.devdir = Path(root) / "sys/bus/pci/devices"
        self._bdfs = list(bdfs) if bdfs is not None else None
        self._ref: dict[tuple[str, str], Optional[int]] = {}

    def bdfs(self) -> list[str]:
        if self._bdfs is not None:
            return self._bdfs
        try:
            return sorted(p.name for p in self.devdir.iterdir() if (p / "aer_dev_fatal").exists())
        except OSError:
            return []

    def _read(self) -> dict[tuple[str, str], Optional[int]]:
        return {(b, kind): parse_aer(read_text(self.devdir / b / f))
                for b in self.bdfs() for kind, f in AER_FILES.items()}

    def arm(self) -> None:
        self._ref = self._read()

    def poll(self) -> list[Incident]:
        out = []
        now = self._read()
        for (bdf, kind), v in now.items():
            ref = self._ref.get((bdf, kind))
            if v is None or ref is None or v <= ref:
                continue
            sev = "warning" if kind == "correctable" else "fatal"
            out.append(self.incident("aer", sev, f"{v - ref} new {kind} AER errors on {bdf}",
                                     gpu=bdf, data={"kind": kind, "total": v}))
        self._ref.update({k: v for k, v in now.items() if v is not None})
        return out
