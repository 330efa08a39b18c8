"""`boot.cmdline.<param>`: kernel command-line parameters as knobs (effect: reboot).

The value in force is the running kernel's (/proc/cmdline, last occurrence wins; a bare flag is
True, an absent one None). A change is never written by the knob itself: it is tried by a one-shot
boot (`metaltune boot try`, tuner.boot), so `apply` refuses with that hint. The default policy
refuses every reboot-effect knob (no rule sets `allow_reboot_effect`).
"""
from __future__ import annotations

from typing import Any

from tuner.boot import cmdline
from tuner.errors import KnobUnavailable, OperationFailed
from tuner.knobs._files import read_text
from tuner.knobs.base import Choice, Effect, Knob

PREFIX = "boot.cmdline."
CMDLINE = "/proc/cmdline"
#: parameter -> (values besides None = absent, what it does); values as the kernel spells them
PARAMS: dict[str, tuple[list[Any], str]] = {
    "iommu": (["pt", "on", "off"], "pt: DMA passthrough for host devices (no translation cost "
              "for the GPUs), IOMMU still on for VFIO"),
    "intel_iommu": (["on", "off"], "Intel VT-d DMA remapping"),
    "amd_iommu": (["on", "off"], "AMD-Vi DMA remapping"),
    "pcie_acs_override": (["downstream", "multifunction", "downstream,multifunction"],
                          "ACS off on switch ports (peer-to-peer over PCIe without the root "
                          "complex); patched kernels only"),
    "hugepagesz": (["2M", "1G"], "size of the huge pages reserved at boot"),
    "hugepages": ([0, 8, 16, 32, 64, 128, 256, 512], "huge pages reserved at boot"),
    "transparent_hugepage": (["always", "madvise", "never"], "THP mode from boot"),
    "numa_balancing": (["enable", "disable"], "automatic NUMA balancing from boot"),
    "processor.max_cstate": ([0, 1, 2, 3], "deepest ACPI C-state"),
    "intel_idle.max_cstate": ([0, 1, 2, 3], "deepest C-state intel_idle uses (0: intel_idle off)"),
}


def running(host: Any) -> list[str]:
    return cmdline.parse(read_text(host.path(CMDLINE)))


class CmdlineParam(Knob):
    effect = Effect.REBOOT

    def __init__(self, host: Any, param: str):
        super().__init__(host, PREFIX + param)
        self.param = param
        self.description = PARAMS[param][1]

    def identity(self) -> str:
        return "kernel-cmdline"

    def read(self) -> Any:
        v = cmdline.value_of(running(self.host), self.param)
        return int(v) if isinstance(v, str) and v.isdigit() and \
            any(isinstance(x, int) for x in PARAMS[self.param][0]) else v

    def limits(self) -> Choice:
        return Choice(values=[None, *PARAMS[self.param][0]])

    def readback_matches(self, wanted: Any, got: Any) -> bool:
        return cmdline.same(wanted, got)

    def pending(self) -> Any:
        """The default boot entry's value when it differs from the running one (a promoted
        trial not yet booted, or an edit by hand): what the next normal boot brings. A trial
        entry is one-shot and never counts."""
        try:
            from tuner.boot.loader import open_loader

            bl = open_loader(self.host)
            opts = cmdline.parse(bl.options_of(bl.default()) or bl.default_entry().get("options", ""))
        except Exception:  # no boot loader we can read (a VM, a container): nothing pending
            return None
        want, cur = cmdline.value_of(opts, self.param), cmdline.value_of(running(self.host), self.param)
        return None if cmdline.same(want, cur) else want

    def verify_note(self, wanted: Any) -> str:
        """Why a wanted value is not in force, in TuneD's words (its bootloader plugin's verify)."""
        cur = cmdline.value_of(running(self.host), self.param)
        want = cmdline.render(self.param, wanted) or f"no {self.param}"
        if cur is None:
            return f"{self.param} is missing from /proc/cmdline (expected {want})"
        return f"{cmdline.render(self.param, cur)} in /proc/cmdline, expected {want}"

    def clear_pending(self) -> None:
        return None

    def _write(self, value: Any) -> None:
        raise OperationFailed(f"{self.name}: a kernel command-line change is tried by a one-shot "
                              f"boot: `metaltune boot try {self.name}={value}`")


def discover(host: Any) -> list[Knob]:
    try:
        running(host)
    except KnobUnavailable:
        return []
    return [CmdlineParam(host, p) for p in PARAMS]
