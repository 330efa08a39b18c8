"""PCI devices as sysfs shows them (`/sys/bus/pci/devices/<bdf>/`), under a Host's root.

Which devices metaltune tunes: NVIDIA GPUs (class 0x0302 3D controller or 0x0300 VGA, vendor
0x10de) and the network controllers (class 0x02) that sit under the same PCIe switch as a GPU (the
NICs GPUDirect RDMA traffic crosses). The path comes from the sysfs symlink
(`../../../devices/pci0000:00/0000:00:01.0/0000:01:00.0`), whose parent folders are the bridges.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner.errors import KnobUnavailable, OperationFailed
from tuner.pci import config as pcicfg

NVIDIA = 0x10DE
GPU_CLASSES = (0x0302, 0x0300)
NIC_CLASS = 0x02
BRIDGE_CLASS = 0x0604
BDF_RE = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
DEVICES = "/sys/bus/pci/devices"


@dataclass
class PciDevice:
    bdf: str
    dir: Path
    vendor: int
    device: int
    class_code: int          # 24-bit: class, subclass, prog-if
    parents: list[str] = field(default_factory=list)  # bridges from the root down

    @property
    def base_class(self) -> int:
        return self.class_code >> 16

    @property
    def class16(self) -> int:
        return self.class_code >> 8

    @property
    def is_nvidia_gpu(self) -> bool:
        return self.vendor == NVIDIA and self.class16 in GPU_CLASSES

    @property
    def is_nic(self) -> bool:
        return self.base_class == NIC_CLASS

    @property
    def kind(self) -> str:
        if self.is_nvidia_gpu:
            return "gpu"
        if self.is_nic:
            return "nic"
        if self.class16 == BRIDGE_CLASS:
            return "bridge"
        return "other"

    def attr(self, name: str) -> str | None:
        try:
            return (self.dir / name).read_text().strip()
        except OSError:
            return None

    # -- config space ------------------------------------------------------------------------
    def read_config(self) -> bytes:
        try:
            return (self.dir / "config").read_bytes()
        except OSError as e:
            raise KnobUnavailable(f"{self.bdf}: cannot read config space: {e}") from None

    def config_writable(self) -> bool:
        """Writable as sysfs says it: the mode bits (kernfs sets 0644 for the config file, a
        read-only tree or a VM's masked view has no write bit; root's DAC override is not asked)."""
        try:
            st = (self.dir / "config").stat()
        except OSError:
            return False
        return bool(st.st_mode & 0o222) and os.access(self.dir / "config", os.W_OK)

    def write_config_word(self, offset: int, value: int) -> None:
        """One aligned 16-bit write (the kernel turns it into one config write of a word)."""
        if offset % 2:
            raise ValueError("unaligned config word")
        if not self.config_writable():
            raise KnobUnavailable(f"{self.bdf}: config space is read-only here")
        try:
            fd = os.open(self.dir / "config", os.O_WRONLY)
            try:
                n = os.pwrite(fd, int(value).to_bytes(2, "little"), offset)
            finally:
                os.close(fd)
        except OSError as e:
            raise OperationFailed(f"{self.bdf}: config write at {offset:#x} failed: {e}") from None
        if n != 2:
            raise OperationFailed(f"{self.bdf}: short config write ({n} of 2 bytes)")

    def devctl(self) -> pcicfg.DeviceControl:
        try:
            return pcicfg.decode_devctl(self.read_config())
        except pcicfg.ConfigError as e:
            raise KnobUnavailable(f"{self.bdf}: {e}") from None

    def update_devctl(self, **fields: Any) -> int:
        """Read-modify-write of Device Control touching only the named fields; returns the new raw."""
        cfg = self.read_config()
        try:
            off = pcicfg.devctl_offset(cfg)
        except pcicfg.ConfigError as e:
            raise KnobUnavailable(f"{self.bdf}: {e}") from None
        new = pcicfg.set_owned_bits(pcicfg.u16(cfg, off), **fields)
        self.write_config_word(off, new)
        return new

    def describe(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "bdf": self.bdf, "kind": self.kind, "vendor": f"{self.vendor:#06x}",
            "device": f"{self.device:#06x}", "class": f"{self.class_code:#08x}",
            "parents": self.parents,
        }
        for a in ("current_link_speed", "current_link_width", "max_link_speed", "max_link_width",
                  "numa_node"):
            v = self.attr(a)
            if v is not None:
                d[a] = v
        try:
            d["devctl"] = self.devctl().as_dict()
        except KnobUnavailable as e:
            d["devctl_error"] = str(e)
        return d


def _int(text: str | None) -> int:
    try:
        return int(text or "0", 16)
    except ValueError:
        return 0


def _parents(host: Any, entry: Path) -> list[str]:
    """Bridges above a device, from its sysfs link target (real) or a `parent` file chain (sim
    trees may store the upstream bridge's BDF in a plain file `parent`)."""
    if entry.is_symlink():
        target = Path(os.path.normpath(entry.parent / os.readlink(entry)))
        return [p for p in target.parts[:-1] if BDF_RE.match(p)]
    chain: list[str] = []
    cur = entry
    for _ in range(16):
        try:
            p = (cur / "parent").read_text().strip()
        except OSError:
            break
        if not BDF_RE.match(p) or p in chain:
            break
        chain.insert(0, p)
        cur = entry.parent / p
    return chain


def list_devices(host: Any) -> list[PciDevice]:
    base = host.path(DEVICES)
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return []
    out = []
    for n in names:
        if not BDF_RE.match(n):
            continue
        d = base / n
        out.append(PciDevice(
            bdf=n, dir=d, vendor=_int(_read(d / "vendor")), device=_int(_read(d / "device")),
            class_code=_int(_read(d / "class")), parents=_parents(host, d),
        ))
    return out


def _read(p: Path) -> str | None:
    try:
        return p.read_text().strip()
    except OSError:
        return None


def tunable_devices(host: Any) -> list[PciDevice]:
    """NVIDIA GPUs, and NICs under the same switch (a shared bridge below the root port)."""
    devs = list_devices(host)
    gpus = [d for d in devs if d.is_nvidia_gpu]
    # A root port alone is shared by everything on that socket's root complex; a switch is what
    # puts a NIC "on the GPU's path" for peer-to-peer. So share a bridge beyond the first.
    gpu_switch_bridges = {b for g in gpus for b in g.parents[1:]}
    nics = [d for d in devs if d.is_nic and any(b in gpu_switch_bridges for b in d.parents[1:])]
    return gpus + nics
