"""CPU and OS knobs: cpufreq governor, energy-performance preference, boost, deepest C-state,
NUMA balancing, transparent huge pages. All files under `host.path(...)`, so the simulated host's
tree covers them.

C-states: `/dev/cpu_dma_latency` (PM QoS) limits C-states only while a process keeps the file
open; the request is dropped when the fd closes, so it cannot be a stored setting. The knob
`cpu.max_cstate_latency_us` therefore uses the persistent alternative, cpuidle's per-state
`disable` files (they stay as written until reboot, whoever dies). `CpuDmaLatencyHold` is the
other path for the daemon: open it once at start, write the int32 latency, keep the fd for the
daemon's life (closing or dying releases it, which is also the safe failure mode).
"""
from __future__ import annotations

import glob
import os
import re
import struct
from pathlib import Path
from typing import Any

from tuner.errors import KnobUnavailable, OperationFailed
from tuner.knobs._files import bracketed, read_text, writable, write_text
from tuner.knobs.base import Choice, Effect, IntRange, Knob, Unsupported

CPU_DIR = "/sys/devices/system/cpu"


def _cpu_dirs(host: Any) -> list[Path]:
    base = host.path(CPU_DIR)
    dirs = [Path(p) for p in glob.glob(str(base / "cpu[0-9]*"))]
    return sorted(dirs, key=lambda p: int(re.sub(r"\D", "", p.name)))


def _uniform(values: dict[str, str]) -> str:
    """The common value, or a `mixed(...)` string that matches no domain value (so verify says
    drifted and apply rewrites every CPU)."""
    vs = set(values.values())
    if len(vs) == 1:
        return vs.pop()
    counts: dict[str, int] = {}
    for v in values.values():
        counts[v] = counts.get(v, 0) + 1
    return "mixed(" + ",".join(f"{k}={n}" for k, n in sorted(counts.items())) + ")"


class _PerCpuFile(Knob):
    """One cpufreq file per CPU, same value written to all; choices from an `available_` file."""

    effect = Effect.NOW
    file = ""
    avail = ""

    def files(self) -> list[Path]:
        return [p for d in _cpu_dirs(self.host) if (p := d / "cpufreq" / self.file).exists()]

    def identity(self) -> str:
        return "cpus"

    def read(self) -> str:
        fs = self.files()
        if not fs:
            raise KnobUnavailable(f"{self.name}: no cpufreq {self.file}")
        return _uniform({str(f): read_text(f) for f in fs})

    def limits(self) -> Any:
        fs = self.files()
        if not fs:
            return Unsupported(reason=f"no cpufreq {self.file} (no cpufreq driver, or a VM)")
        if not all(writable(f) for f in fs):
            return Unsupported(reason=f"cpufreq {self.file} is read-only here (VM?)")
        return Choice(values=read_text(fs[0].parent / self.avail).split())

    def _write(self, value: str) -> None:
        for f in self.files():
            write_text(f, value)


class Governor(_PerCpuFile):
    file, avail = "scaling_governor", "scaling_available_governors"
    description = "cpufreq scaling governor on every CPU (performance avoids ramp-up latency)."

    def __init__(self, host: Any):
        super().__init__(host, "cpu.governor")


class EnergyPerfPreference(_PerCpuFile):
    file, avail = "energy_performance_preference", "energy_performance_available_preferences"
    description = ("HWP energy-performance preference (intel_pstate/amd-pstate active mode); "
                   "the performance governor pins it to 'performance' and refuses others (EBUSY).")

    def __init__(self, host: Any):
        super().__init__(host, "cpu.energy_performance_preference")


class Boost(Knob):
    """Turbo/boost: cpufreq/boost (acpi-cpufreq, amd-pstate; 1 = on) or intel_pstate/no_turbo
    (inverted: 1 = off). The value is always 'boost enabled'."""

    effect = Effect.NOW
    description = "CPU turbo/boost. Off trades peak single-thread speed for steadier clocks."

    def __init__(self, host: Any):
        super().__init__(host, "cpu.boost")

    def _file(self) -> tuple[Path, bool] | None:
        p = self.host.path(f"{CPU_DIR}/cpufreq/boost")
        if p.exists():
            return p, False
        p = self.host.path(f"{CPU_DIR}/intel_pstate/no_turbo")
        if p.exists():
            return p, True
        return None

    def identity(self) -> str:
        return "cpus"

    def read(self) -> bool:
        f = self._file()
        if f is None:
            raise KnobUnavailable("cpu.boost: no cpufreq/boost or intel_pstate/no_turbo")
        v = read_text(f[0]) == "1"
        return (not v) if f[1] else v

    def limits(self) -> Any:
        f = self._file()
        if f is None:
            return Unsupported(reason="no cpufreq/boost or intel_pstate/no_turbo")
        if not writable(f[0]):
            return Unsupported(reason=f"{f[0].name} is read-only here (VM?)")
        return Choice(values=[False, True])

    def _write(self, value: bool) -> None:
        f = self._file()
        assert f is not None
        write_text(f[0], "1" if (bool(value) != f[1]) else "0")


class MaxCStateLatency(Knob):
    """Deepest allowed C-state, as the largest exit latency (µs) of the idle states left enabled:
    every cpuidle state with a higher latency is disabled on every CPU (sysfs `disable`, persists
    until reboot without a holder process). 0 keeps only POLL/C0-like states."""

    effect = Effect.NOW
    unit = "us"
    description = ("Deepest allowed C-state by exit latency: lower = less wake-up jitter for "
                   "kernel-launch-bound inference, more idle power.")

    def __init__(self, host: Any):
        super().__init__(host, "cpu.max_cstate_latency_us")

    def _states(self) -> list[tuple[Path, int]]:
        out = []
        for d in _cpu_dirs(self.host):
            for s in sorted(glob.glob(str(d / "cpuidle" / "state[0-9]*"))):
                sp = Path(s)
                try:
                    out.append((sp, int(read_text(sp / "latency"))))
                except (KnobUnavailable, ValueError):
                    continue
        return out

    def identity(self) -> str:
        return "cpus"

    def read(self) -> int:
        st = self._states()
        if not st:
            raise KnobUnavailable("cpu.max_cstate_latency_us: no cpuidle states")
        enabled = [lat for p, lat in st if read_text(p / "disable") == "0"]
        return max(enabled) if enabled else 0

    def limits(self) -> Any:
        st = self._states()
        if not st:
            return Unsupported(reason="no cpuidle states (cpuidle off, or a VM)")
        if not all(writable(p / "disable") for p, _ in st):
            return Unsupported(reason="cpuidle disable files are read-only here")
        # any bound is meaningful (states above it are disabled; above the deepest state means
        # all enabled), so one profile value fits hosts with different C-state tables; a search
        # only needs the distinct state latencies
        return LatencyBound(min=0, max=1_000_000, unit="us",
                            points=sorted({lat for _, lat in st}))

    def search_points(self) -> list[int]:
        return sorted({lat for _, lat in self._states()})

    def readback_matches(self, wanted: Any, got: Any) -> bool:
        # reading gives the deepest enabled state's latency: the largest latency <= wanted
        lats = [lat for _, lat in self._states() if lat <= int(wanted)]
        return got == (max(lats) if lats else 0)

    def _write(self, value: int) -> None:
        for p, lat in self._states():
            want = "1" if lat > int(value) else "0"
            if read_text(p / "disable") != want:
                write_text(p / "disable", want)


class LatencyBound(IntRange):
    """An IntRange whose search values are the idle states' exit latencies, not every µs."""

    points: list[int] = []

    def search_values(self) -> list[int]:
        return list(self.points)

    def describe(self) -> str:
        return f"any bound in us; states at {self.points}"


class CpuDmaLatencyHold:
    """Hold a PM QoS CPU latency request through /dev/cpu_dma_latency for as long as this object
    lives (the daemon keeps one open; the kernel drops the request when the fd closes)."""

    def __init__(self, host: Any, latency_us: int):
        if latency_us < 0:
            raise ValueError("latency must be >= 0 µs")
        self.path = host.path("/dev/cpu_dma_latency")
        self.latency_us = latency_us
        self.fd: int | None = None

    def open(self) -> "CpuDmaLatencyHold":
        try:
            self.fd = os.open(self.path, os.O_WRONLY)
            os.write(self.fd, struct.pack("=i", int(self.latency_us)))  # binary s32, per the ABI
        except OSError as e:
            self.close()
            raise OperationFailed(f"{self.path}: {e.strerror or e}") from None
        return self

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> "CpuDmaLatencyHold":
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()


class _OsChoiceFile(Knob):
    effect = Effect.NOW
    path = ""

    def identity(self) -> str:
        return "os"

    def _p(self) -> Path:
        return self.host.path(self.path)


class NumaBalancing(_OsChoiceFile):
    path = "/proc/sys/kernel/numa_balancing"
    description = ("Automatic NUMA balancing (kernel.numa_balancing): its page migrations and "
                   "hinting faults add latency jitter to pinned inference processes.")

    def __init__(self, host: Any):
        super().__init__(host, "os.numa_balancing")

    def read(self) -> int:
        return int(read_text(self._p()))

    def limits(self) -> Any:
        p = self._p()
        if not p.exists():
            return Unsupported(reason="kernel without NUMA balancing")
        if not writable(p):
            return Unsupported(reason="kernel.numa_balancing is read-only here")
        return Choice(values=[0, 1])

    def _write(self, value: int) -> None:
        write_text(self._p(), str(int(value)))


class TransparentHugepages(_OsChoiceFile):
    path = "/sys/kernel/mm/transparent_hugepage/enabled"
    description = ("THP mode: 'madvise' lets allocators that ask (PyTorch pinned pools) get huge "
                   "pages without khugepaged stalls elsewhere.")

    def __init__(self, host: Any):
        super().__init__(host, "os.transparent_hugepages")

    MODES = ["always", "madvise", "never"]

    def _parse(self) -> tuple[str, list[str]]:
        text = read_text(self._p())
        cur, opts = bracketed(text)
        if cur is None and len(opts) == 1 and opts[0] in self.MODES:
            # a plain file holding the last written mode (the simulated host's tree keeps what
            # was written; the kernel would render "always [madvise] never")
            return opts[0], list(self.MODES)
        if cur is None:
            raise KnobUnavailable(f"{self._p()}: no [selected] mode in {text!r}")
        return cur, opts

    def read(self) -> str:
        return self._parse()[0]

    def limits(self) -> Any:
        p = self._p()
        if not p.exists():
            return Unsupported(reason="kernel without transparent huge pages")
        if not writable(p):
            return Unsupported(reason="THP setting is read-only here")
        return Choice(values=self._parse()[1])

    def _write(self, value: str) -> None:
        write_text(self._p(), value)


def discover(host: Any) -> list[Knob]:
    knobs: list[Knob] = [Governor(host), EnergyPerfPreference(host), Boost(host),
                         MaxCStateLatency(host), NumaBalancing(host), TransparentHugepages(host)]
    out = []
    for k in knobs:
        try:
            k.read()
        except KnobUnavailable:
            continue  # the interface is not on this host at all
        out.append(k)
    return out
