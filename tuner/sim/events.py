"""What a misbehaving GPU leaves behind: NVML events plus the kernel log lines the driver writes."""
from __future__ import annotations

from typing import Any

import pynvml

from tuner.sim.state import SimState

XID_TEXT = {
    13: "Graphics SM Warp Exception on (GPC 0, TPC 2, SM 1): Out Of Range Address",
    31: "Ch 00000010, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ "
        "0x7f3a_5c000000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
    43: "Ch 00000008",
    48: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at "
        "partition 0, subpartition 0.",
    62: "0c6d(2d60) 00000000 00000000",
    63: "Row Remapper: New row marked for remapping, reset gpu to activate.",
    79: "GPU has fallen off the bus.",
    94: "Contained: SM (0x1). RST: No, D-RST: No",
    95: "Uncontained: FBHUB. RST: Yes, D-RST: No",
}


def kmsg_pci(bdf: str) -> str:
    """The driver names a GPU by domain:bus:device, without the function: PCI:0000:18:00."""
    return bdf.rsplit(".", 1)[0]


def queue_xid(state: SimState, st: dict[str, Any], gpu: int, xid: int, pid: int | None = None,
              name: str = "python3") -> None:
    """Call inside state.edit(): an Xid event for nvmlEventSetWait plus its NVRM kmsg line."""
    g = st["gpus"][gpu]
    state.add_event(st, gpu, pynvml.nvmlEventTypeXidCriticalError, int(xid))
    who = f"pid={pid}, name={name}, " if pid else "pid='<unknown>', name=<unknown>, "
    text = XID_TEXT.get(int(xid), "")
    state.add_kmsg(st, f"NVRM: Xid (PCI:{kmsg_pci(g['bdf'])}): {int(xid)}, {who}{text}".rstrip(", "))
