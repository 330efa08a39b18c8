"""PCIe configuration-space decoding, pure functions over bytes.

The PCI Express capability is found by walking the capability list that starts at the pointer in
0x34 (only if Status bit 4 says there is a list). Its Device Control register (cap + 0x08) holds
the two fields metaltune tunes: Enable Relaxed Ordering (bit 4) and Max_Read_Request_Size
(bits 14:12). Bit 15 is Initiate Function Level Reset on endpoints (Bridge Config Retry Enable on
bridges): writing 1 there resets the GPU, so every write is a read-modify-write of owned bits only
and bit 15 is always written back as 0.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Iterator

CAP_PTR = 0x34
STATUS = 0x06
STATUS_CAP_LIST = 1 << 4
CAP_ID_PCIE = 0x10

# offsets inside the PCI Express capability
PCIE_FLAGS = 0x02
DEVCAP = 0x04
DEVCTL = 0x08
DEVSTA = 0x0A
LNKCAP = 0x0C
LNKSTA = 0x12

# Device Control bits
DEVCTL_CERE = 1 << 0
DEVCTL_NFERE = 1 << 1
DEVCTL_FERE = 1 << 2
DEVCTL_URRE = 1 << 3
DEVCTL_RELAX_EN = 1 << 4
DEVCTL_PAYLOAD = 0x7 << 5
DEVCTL_EXT_TAG = 1 << 8
DEVCTL_PHANTOM = 1 << 9
DEVCTL_AUX_PME = 1 << 10
DEVCTL_NOSNOOP_EN = 1 << 11
DEVCTL_READRQ = 0x7 << 12
DEVCTL_BCR_FLR = 1 << 15
DEVCTL_READRQ_SHIFT = 12

DEVCAP_FLR = 1 << 28
#: encodings 0..5 are 128..4096 bytes; 6 and 7 are reserved
SIZES = [128, 256, 512, 1024, 2048, 4096]

PORT_TYPES = {
    0: "Endpoint", 1: "Legacy Endpoint", 4: "Root Port", 5: "Upstream Port",
    6: "Downstream Port", 7: "PCI-PCIe Bridge", 8: "PCIe-PCI Bridge",
    9: "Root Complex Integrated Endpoint", 10: "Root Complex Event Collector",
}


class ConfigError(ValueError):
    """Config bytes that do not hold what was asked for (no capability list, no PCIe cap)."""


def _u8(b: bytes, off: int) -> int:
    if off + 1 > len(b):
        raise ConfigError(f"config space ends at {len(b):#x}, wanted byte {off:#x}")
    return b[off]


def u16(b: bytes, off: int) -> int:
    if off + 2 > len(b):
        raise ConfigError(f"config space ends at {len(b):#x}, wanted word {off:#x}")
    return int.from_bytes(b[off:off + 2], "little")


def u32(b: bytes, off: int) -> int:
    if off + 4 > len(b):
        raise ConfigError(f"config space ends at {len(b):#x}, wanted dword {off:#x}")
    return int.from_bytes(b[off:off + 4], "little")


def capabilities(cfg: bytes) -> Iterator[tuple[int, int]]:
    """(cap_id, offset) for each standard capability, following next pointers from 0x34.

    Loop-safe: a malformed list that points back into itself stops after 48 entries, as the
    kernel's __pci_find_next_cap_ttl does."""
    if len(cfg) < 0x40 or not (u16(cfg, STATUS) & STATUS_CAP_LIST):
        return
    pos = _u8(cfg, CAP_PTR) & 0xFC
    seen: set[int] = set()
    for _ in range(48):
        if pos < 0x40 or pos in seen or pos + 2 > len(cfg):
            return
        seen.add(pos)
        cid = cfg[pos]
        if cid == 0xFF:
            return
        yield cid, pos
        pos = cfg[pos + 1] & 0xFC


def find_cap(cfg: bytes, cap_id: int) -> int | None:
    for cid, pos in capabilities(cfg):
        if cid == cap_id:
            return pos
    return None


def pcie_cap(cfg: bytes) -> int:
    pos = find_cap(cfg, CAP_ID_PCIE)
    if pos is None:
        if len(cfg) <= 64:
            raise ConfigError("only the first 64 bytes of config space are readable "
                              "(not root?): no PCI Express capability visible")
        raise ConfigError("no PCI Express capability (0x10) in the capability list")
    return pos


def devctl_offset(cfg: bytes) -> int:
    return pcie_cap(cfg) + DEVCTL


def readrq_bytes(devctl: int) -> int:
    enc = (devctl & DEVCTL_READRQ) >> DEVCTL_READRQ_SHIFT
    # reserved encodings: report what lspci prints (128 << enc)
    return 128 << enc


def payload_bytes(devctl: int) -> int:
    return 128 << ((devctl & DEVCTL_PAYLOAD) >> 5)


def set_owned_bits(devctl: int, *, relaxed_ordering: bool | None = None,
                   max_read_request: int | None = None) -> int:
    """New Device Control value: only the requested fields change; FLR (bit 15) is cleared."""
    v = devctl & ~DEVCTL_BCR_FLR & 0xFFFF
    if relaxed_ordering is not None:
        v = (v | DEVCTL_RELAX_EN) if relaxed_ordering else (v & ~DEVCTL_RELAX_EN)
    if max_read_request is not None:
        if max_read_request not in SIZES:
            raise ValueError(f"max read request {max_read_request} not one of {SIZES}")
        v = (v & ~DEVCTL_READRQ) | (SIZES.index(max_read_request) << DEVCTL_READRQ_SHIFT)
    return v


@dataclass
class DeviceControl:
    """Decoded Device Control (+ what DevCap says about the fields), named as lspci prints them."""

    offset: int
    raw: int
    CorrErr: bool
    NonFatalErr: bool
    FatalErr: bool
    UnsupReq: bool
    RlxdOrd: bool
    ExtTag: bool
    PhantFunc: bool
    AuxPwr: bool
    NoSnoop: bool
    FLReset_capable: bool
    MaxPayload: int
    MaxReadReq: int
    port_type: str

    def as_dict(self) -> dict:
        d = asdict(self)
        d["offset"] = f"{self.offset:#x}"
        d["raw"] = f"{self.raw:#06x}"
        return d


def decode_devctl(cfg: bytes) -> DeviceControl:
    cap = pcie_cap(cfg)
    v = u16(cfg, cap + DEVCTL)
    devcap = u32(cfg, cap + DEVCAP)
    ptype = (u16(cfg, cap + PCIE_FLAGS) >> 4) & 0xF
    return DeviceControl(
        offset=cap + DEVCTL, raw=v,
        CorrErr=bool(v & DEVCTL_CERE), NonFatalErr=bool(v & DEVCTL_NFERE),
        FatalErr=bool(v & DEVCTL_FERE), UnsupReq=bool(v & DEVCTL_URRE),
        RlxdOrd=bool(v & DEVCTL_RELAX_EN), ExtTag=bool(v & DEVCTL_EXT_TAG),
        PhantFunc=bool(v & DEVCTL_PHANTOM), AuxPwr=bool(v & DEVCTL_AUX_PME),
        NoSnoop=bool(v & DEVCTL_NOSNOOP_EN), FLReset_capable=bool(devcap & DEVCAP_FLR),
        MaxPayload=payload_bytes(v), MaxReadReq=readrq_bytes(v),
        port_type=PORT_TYPES.get(ptype, f"type {ptype}"),
    )


def link_status(cfg: bytes) -> dict:
    cap = pcie_cap(cfg)
    sta, lcap = u16(cfg, cap + LNKSTA), u32(cfg, cap + LNKCAP)
    return {"speed_gen": sta & 0xF, "width": (sta >> 4) & 0x3F,
            "max_speed_gen": lcap & 0xF, "max_width": (lcap >> 4) & 0x3F}


# ---------------------------------------------------------------------------------------------
# Building config bytes (the simulated host and the tests) and the `lspci -x` text format.


def build_config(vendor: int, device: int, class_code: int, *, devctl: int = 0x2810,
                 devcap: int = 0x10008FE1 | DEVCAP_FLR, port_type: int = 0,
                 link_gen: int = 5, link_width: int = 16, size: int = 4096,
                 header_type: int = 0, extra_caps: bool = True) -> bytes:
    """A plausible PCIe function's config space: PM cap at 0x60, MSI at 0x68, PCIe at 0x78
    (the layout NVIDIA datacenter GPUs show), MSI-X at 0xB4, and (optionally) a vendor cap."""
    b = bytearray(size)
    b[0:2] = vendor.to_bytes(2, "little")
    b[2:4] = device.to_bytes(2, "little")
    b[4:6] = (0x0406).to_bytes(2, "little")            # Command: mem space + bus master
    b[6:8] = (STATUS_CAP_LIST | 0x0000).to_bytes(2, "little")
    b[8] = 0xA1                                        # revision
    b[9:12] = class_code.to_bytes(3, "little")         # prog-if, subclass, class
    b[0x0E] = header_type
    b[0x2C:0x30] = (vendor | (0x1000 << 16)).to_bytes(4, "little")  # subsystem
    b[CAP_PTR] = 0x60
    b[0x60:0x62] = bytes([0x01, 0x68])                 # power management
    b[0x62:0x64] = (0x0003).to_bytes(2, "little")
    b[0x68:0x6A] = bytes([0x05, 0x78])                 # MSI
    pcie = 0x78
    b[pcie:pcie + 2] = bytes([CAP_ID_PCIE, 0xB4 if extra_caps else 0x00])
    b[pcie + PCIE_FLAGS:pcie + PCIE_FLAGS + 2] = (0x0002 | (port_type << 4)).to_bytes(2, "little")
    b[pcie + DEVCAP:pcie + DEVCAP + 4] = devcap.to_bytes(4, "little")
    b[pcie + DEVCTL:pcie + DEVCTL + 2] = devctl.to_bytes(2, "little")
    b[pcie + LNKCAP:pcie + LNKCAP + 4] = (link_gen | (link_width << 4)).to_bytes(4, "little")
    b[pcie + LNKSTA:pcie + LNKSTA + 2] = (link_gen | (link_width << 4)).to_bytes(2, "little")
    if extra_caps:
        b[0xB4:0xB6] = bytes([0x11, 0x00])             # MSI-X, end of list
    return bytes(b)


def to_lspci_x(cfg: bytes, slot: str = "00:00.0", title: str = "Device") -> str:
    """Text in the format of `lspci -xxx`/`-xxxx`, which `lspci -F FILE` reads back."""
    lines = [f"{slot} {title}"]
    for off in range(0, len(cfg), 16):
        lines.append(f"{off:02x}: " + " ".join(f"{x:02x}" for x in cfg[off:off + 16]))
    return "\n".join(lines) + "\n\n"
