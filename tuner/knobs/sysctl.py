"""`sysctl.<dotted.name>` knobs, only for the names in ALLOWED (each with the domain metaltune
will search or accept from a profile). Anything else is not a knob: a profile naming it is bad
input. kernel.numa_balancing is `os.numa_balancing` (cpu.py), so it is not repeated here."""
from __future__ import annotations

from typing import Any, Callable

from tuner.knobs._files import read_text, writable, write_text
from tuner.knobs.base import Choice, Effect, IntRange, Knob, Unsupported

Domain = Callable[[], Any]

BIG = 2**31 - 1


class Points(IntRange):
    """Any integer in [min, max] is accepted (a host may already run a larger value than any we
    would pick), but a search only tries `points`."""

    points: list[int] = []

    def search_values(self) -> list[int]:
        return list(self.points)

    def describe(self) -> str:
        return f"[{self.min}, {self.max}]; searched at {self.points}"


#: name -> (domain, why it matters for a GPU inference host)
ALLOWED: dict[str, tuple[Domain, str]] = {
    "vm.swappiness": (lambda: IntRange(min=0, max=100, step=10),
                      "keep model weights and pinned host buffers out of swap"),
    "vm.zone_reclaim_mode": (lambda: Choice(values=[0, 1]),
                             "1 reclaims node-local page cache before going remote; 0 for big hosts"),
    "vm.max_map_count": (lambda: Points(min=65530, max=BIG, points=[65530, 262144, 1048576]),
                         "mmap-heavy loaders (safetensors, many shards) exceed the default"),
    "vm.dirty_ratio": (lambda: IntRange(min=5, max=80, step=5),
                       "checkpoint/KV-cache spill write-back bursts"),
    "vm.dirty_background_ratio": (lambda: IntRange(min=1, max=50, step=1),
                                  "start write-back early so dirty_ratio stalls are rare"),
    "vm.stat_interval": (lambda: IntRange(min=1, max=10, step=1),
                         "vmstat worker wake-ups cause jitter on busy cores"),
    "kernel.sched_autogroup_enabled": (lambda: Choice(values=[0, 1]),
                                       "autogroup is for desktops; servers fair-share by cgroup"),
    "kernel.nmi_watchdog": (lambda: Choice(values=[0, 1]),
                            "the NMI watchdog's perf counter interrupts add jitter"),
    "net.core.rmem_max": (lambda: Points(min=4096, max=BIG,
                                         points=[212992, 4194304, 16777216, 67108864]),
                          "socket receive buffers for multi-host NCCL/TCP and serving front ends"),
    "net.core.wmem_max": (lambda: Points(min=4096, max=BIG,
                                         points=[212992, 4194304, 16777216, 67108864]),
                          "socket send buffers, as rmem_max"),
    "net.core.netdev_max_backlog": (lambda: Points(min=100, max=BIG,
                                                   points=[1000, 5000, 30000, 250000]),
                                    "packet backlog on fast NICs"),
}


class Sysctl(Knob):
    effect = Effect.NOW

    def __init__(self, host: Any, dotted: str):
        super().__init__(host, f"sysctl.{dotted}")
        self.dotted = dotted
        self.description = ALLOWED[dotted][1]

    def _p(self):
        return self.host.path("/proc/sys/" + self.dotted.replace(".", "/"))

    def identity(self) -> str:
        return "os"

    def read(self) -> int:
        t = read_text(self._p())
        try:
            return int(t)
        except ValueError:
            return t  # type: ignore[return-value]

    def limits(self) -> Any:
        p = self._p()
        if not p.exists():
            return Unsupported(reason=f"{self.dotted} does not exist on this kernel")
        if not writable(p):
            return Unsupported(reason=f"{self.dotted} is read-only here (VM or container)")
        return ALLOWED[self.dotted][0]()

    def _write(self, value: int) -> None:
        write_text(self._p(), str(int(value)))


def discover(host: Any) -> list[Knob]:
    return [Sysctl(host, n) for n in ALLOWED
            if host.path("/proc/sys/" + n.replace(".", "/")).exists()]
