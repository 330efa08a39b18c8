"""PCIe Device Control knobs: `pcie.<bdf>.relaxed_ordering` and `pcie.<bdf>.max_read_request_bytes`.

They read and write `/sys/bus/pci/devices/<bdf>/config` (tuner.pci): the PCI Express capability is
found by walking the capability list, and each write is a read-modify-write of the knob's own bits
(never bit 15, function level reset). Effect: at once, and lost on reboot, on a function reset and
when the driver re-initialises the device; the profile layer re-applies them.
"""
from __future__ import annotations

from typing import Any

from tuner.knobs.base import Choice, Effect, Knob, Unsupported
from tuner.pci import config as pcicfg
from tuner.pci.sysfs import PciDevice, tunable_devices
from tuner.errors import KnobUnavailable


class _DevCtlKnob(Knob):
    effect = Effect.NOW

    def __init__(self, host: Any, dev: PciDevice, field: str):
        super().__init__(host, f"pcie.{dev.bdf}.{field}")
        self.dev = dev

    def identity(self) -> str:
        return f"pci:{self.dev.bdf}"

    def _unsupported_reason(self) -> str | None:
        try:
            self.dev.devctl()
        except KnobUnavailable as e:
            return str(e)
        if not self.dev.config_writable():
            return f"{self.dev.bdf}: config space is read-only here (VM or no write permission)"
        return None


class RelaxedOrdering(_DevCtlKnob):
    unit = ""
    description = ("Device Control bit 4 (Enable Relaxed Ordering): lets the device set the RO "
                   "attribute on its writes, which helps GPUDirect/P2P throughput on some root "
                   "complexes and is unsafe on others (some AMD and older Intel parts).")

    def __init__(self, host: Any, dev: PciDevice):
        super().__init__(host, dev, "relaxed_ordering")

    def read(self) -> bool:
        return self.dev.devctl().RlxdOrd

    def limits(self) -> Any:
        why = self._unsupported_reason()
        return Unsupported(reason=why) if why else Choice(values=[False, True])

    def _write(self, value: bool) -> None:
        self.dev.update_devctl(relaxed_ordering=bool(value))


class MaxReadRequest(_DevCtlKnob):
    unit = "B"
    description = ("Device Control bits 14:12 (Max_Read_Request_Size): the largest read the "
                   "device may request; larger requests mean fewer TLPs for DMA reads.")

    def __init__(self, host: Any, dev: PciDevice):
        super().__init__(host, dev, "max_read_request_bytes")

    def read(self) -> int:
        return self.dev.devctl().MaxReadReq

    def limits(self) -> Any:
        why = self._unsupported_reason()
        return Unsupported(reason=why) if why else Choice(values=list(pcicfg.SIZES), unit="B")

    def _write(self, value: int) -> None:
        self.dev.update_devctl(max_read_request=int(value))


def discover(host: Any) -> list[Knob]:
    out: list[Knob] = []
    for dev in tunable_devices(host):
        out += [RelaxedOrdering(host, dev), MaxReadRequest(host, dev)]
    return out
