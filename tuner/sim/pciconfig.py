"""Real PCIe configuration-space bytes for a simulated GPU (4096 bytes, as sysfs `config` shows to
root): type-0 header, the capability list from 0x34 (Power Management, MSI, PCI Express at 0x60 as
on the probed H200, MSI-X) and extended capabilities from 0x100 (AER, Secondary PCIe). Device
Control of the PCIe capability defaults to 0x5134, the value read on the real H200.
"""
from __future__ import annotations

import struct

from tuner.sim.skus import Sku

PCIE_CAP = 0x60
AER_CAP = 0x100
DEVCTL_DEFAULT = 0x5134  # FatalErr+, RlxdOrd+, MaxPayload 256, ExtTag+, MaxReadReq 4096

GEN_SPEED = {1: "2.5 GT/s PCIe", 2: "5.0 GT/s PCIe", 3: "8.0 GT/s PCIe", 4: "16.0 GT/s PCIe",
             5: "32.0 GT/s PCIe"}


def _put(buf: bytearray, off: int, fmt: str, val: int) -> None:
    struct.pack_into("<" + fmt, buf, off, val)


def build_config(sku: Sku, vm: bool = False) -> bytes:
    b = bytearray(4096)
    # -- type 0 header ------------------------------------------------------------------------
    _put(b, 0x00, "H", 0x10DE)
    _put(b, 0x02, "H", sku.pci_device_id)
    _put(b, 0x04, "H", 0x0406)  # Mem+ BusMaster+ DisINTx+
    _put(b, 0x06, "H", 0x0010)  # Cap+
    b[0x08] = sku.revision
    b[0x09:0x0C] = bytes([sku.pci_class & 0xFF, (sku.pci_class >> 8) & 0xFF, sku.pci_class >> 16])
    b[0x0E] = 0x00  # header type 0, single function
    _put(b, 0x10, "I", 0xF2000000)  # BAR0: 32-bit, non-prefetchable registers
    _put(b, 0x14, "I", 0x0000000C)  # BAR1: 64-bit prefetchable framebuffer aperture
    _put(b, 0x18, "I", 0x00000380 if not vm else 0x00000040)
    _put(b, 0x1C, "I", 0x0000000C)  # BAR3: 64-bit prefetchable
    _put(b, 0x20, "I", 0x00000384 if not vm else 0x00000041)
    _put(b, 0x2C, "H", 0x10DE)
    _put(b, 0x2E, "H", sku.pci_subsys)
    b[0x34] = 0x40
    b[0x3C] = 0xFF
    b[0x3D] = 0x01  # INTA
    # -- Power Management (0x40) --------------------------------------------------------------
    b[0x40], b[0x41] = 0x01, 0x48
    _put(b, 0x42, "H", 0x0003)  # version 3
    _put(b, 0x44, "H", 0x0008)  # D0, NoSoftRst+
    # -- MSI, 64-bit (0x48) -------------------------------------------------------------------
    b[0x48], b[0x49] = 0x05, PCIE_CAP
    _put(b, 0x4A, "H", 0x0080)
    # -- PCI Express v2, endpoint (0x60, 0x3c bytes) ------------------------------------------
    p = PCIE_CAP
    b[p], b[p + 1] = 0x10, 0x9C
    _put(b, p + 0x02, "H", 0x0002)
    devcap = 0x1 | (1 << 5) | (7 << 6) | (6 << 9) | (1 << 15) | (1 << 28)  # MPS 256 ExtTag RBE FLR
    _put(b, p + 0x04, "I", devcap)
    _put(b, p + 0x08, "H", DEVCTL_DEFAULT)
    _put(b, p + 0x0A, "H", 0x0000)
    lnkcap = sku.pcie_gen | (sku.pcie_width << 4) | (1 << 22)
    _put(b, p + 0x0C, "I", lnkcap)
    _put(b, p + 0x10, "H", 0x0040)  # CommClk+
    _put(b, p + 0x12, "H", sku.pcie_gen | (sku.pcie_width << 4) | (1 << 12))  # SlotClk+
    _put(b, p + 0x24, "I", 0x0003001F)  # completion timeout ranges ABCD, 10-bit tags
    _put(b, p + 0x2C, "I", sum(1 << i for i in range(1, sku.pcie_gen + 1)))  # supported speeds
    _put(b, p + 0x30, "H", sku.pcie_gen)  # target link speed
    _put(b, p + 0x32, "H", 0x001E)  # equalisation complete, phases 1-3 ok
    # -- MSI-X (0x9c) -------------------------------------------------------------------------
    b[0x9C], b[0x9D] = 0x11, 0x00
    _put(b, 0x9E, "H", 0x8008)  # enabled, 9 vectors
    _put(b, 0xA0, "I", 0x00B90000)
    _put(b, 0xA4, "I", 0x00BA0000)
    # -- extended: AER v2 (0x100), Secondary PCIe (0x148) -------------------------------------
    a = AER_CAP
    _put(b, a, "I", 0x0001 | (2 << 16) | (0x148 << 20))
    _put(b, a + 0x0C, "I", 0x00462030)  # uncorrectable severity: spec defaults
    _put(b, a + 0x14, "I", 0x00002000)  # advisory non-fatal masked
    _put(b, a + 0x18, "I", 0x000000A0)  # ECRC generation / check capable
    s = 0x148
    _put(b, s, "I", 0x0019 | (1 << 16) | (0 << 20))
    return bytes(b)


AER_COR_FIELDS = ["RxErr", "BadTLP", "BadDLLP", "Rollover", "Timeout", "NonFatalErr",
                  "CorrIntErr", "HeaderOF"]
AER_UNC_FIELDS = ["Undefined", "DLP", "SDES", "TLP", "FCP", "CmpltTO", "CmpltAbrt", "UnxCmplt",
                  "RxOF", "MalfTLP", "ECRC", "UnsupReq", "ACSViol", "UncorrIntErr", "BlockedTLP",
                  "AtomicOpBlocked", "TLPBlockedErr", "PoisonTLPBlocked"]
# which AER status bit each field counts (correctable / uncorrectable status registers)
AER_COR_BIT = {"RxErr": 0, "BadTLP": 6, "BadDLLP": 7, "Rollover": 8, "Timeout": 12,
               "NonFatalErr": 13, "CorrIntErr": 14, "HeaderOF": 15}
AER_UNC_BIT = {"DLP": 4, "SDES": 5, "TLP": 12, "FCP": 13, "CmpltTO": 14, "CmpltAbrt": 15,
               "UnxCmplt": 16, "RxOF": 17, "MalfTLP": 18, "ECRC": 19, "UnsupReq": 20,
               "ACSViol": 21, "UncorrIntErr": 22, "BlockedTLP": 23, "AtomicOpBlocked": 24,
               "TLPBlockedErr": 25, "PoisonTLPBlocked": 26}


def aer_text(kind: str, counts: dict[str, int]) -> str:
    """Contents of sysfs aer_dev_{correctable,nonfatal,fatal}."""
    fields = AER_COR_FIELDS if kind == "correctable" else AER_UNC_FIELDS
    total = {"correctable": "TOTAL_ERR_COR", "nonfatal": "TOTAL_ERR_NONFATAL",
             "fatal": "TOTAL_ERR_FATAL"}[kind]
    lines = [f"{f} {int(counts.get(f, 0))}" for f in fields]
    lines.append(f"{total} {sum(int(counts.get(f, 0)) for f in fields)}")
    return "\n".join(lines) + "\n"


def parse_aer(text: str) -> dict[str, int]:
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and not parts[0].startswith("TOTAL_"):
            out[parts[0]] = int(parts[1])
    return out
