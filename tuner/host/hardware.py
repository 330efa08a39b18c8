"""Hardware detection: GPUs (model, UUID, PCI bus id, driver), PCIe topology and virtualisation,
for `match:` rules in profiles, `metaltune host` and the compare issue. Read-only, never fails:
what cannot be read is reported as unknown with the reason.
"""
from __future__ import annotations

import re
import shutil
from typing import Any, Optional

from pydantic import BaseModel, Field

from tuner.pci.sysfs import list_devices


class GpuInfo(BaseModel):
    index: int
    name: str
    uuid: Optional[str] = None
    pci_bus_id: Optional[str] = None
    virtualization_mode: Optional[str] = None
    max_clocks_mhz: dict[str, int] = Field(default_factory=dict)


class VirtInfo(BaseModel):
    is_vm: bool
    hypervisor_flag: bool
    dmi_vendor: Optional[str] = None
    dmi_product: Optional[str] = None
    systemd_detect_virt: Optional[str] = None   # `systemd-detect-virt --vm`: VM type or "none"
    container: Optional[str] = None             # `systemd-detect-virt --container`
    nvml_virtualization_mode: Optional[str] = None
    evidence: list[str] = Field(default_factory=list)


class HardwareInfo(BaseModel):
    backend: str
    gpus: list[GpuInfo] = Field(default_factory=list)
    driver_version: Optional[str] = None
    nvml_version: Optional[str] = None
    cuda_driver_version: Optional[int] = None
    pcie: list[dict[str, Any]] = Field(default_factory=list)
    virtualization: VirtInfo
    cpu_model: Optional[str] = None
    errors: list[str] = Field(default_factory=list)

    @property
    def gpu_name(self) -> Optional[str]:
        return self.gpus[0].name if self.gpus else None


# nvmlGpuVirtualizationMode values (nvml.h)
NVML_VIRT_MODES = {0: "none", 1: "passthrough", 2: "vgpu", 3: "host_vgpu", 4: "host_vsga"}
DMI_VM_VENDORS = ("qemu", "kvm", "amazon ec2", "microsoft corporation", "google", "xen",
                  "vmware", "innotek", "virtualbox", "openstack", "firecracker", "bochs",
                  "oracle cloud", "alibaba cloud", "digitalocean")


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _read(host: Any, p: str) -> Optional[str]:
    try:
        return host.path(p).read_text().strip()
    except OSError:
        return None


def detect_gpus(host: Any, info: HardwareInfo) -> None:
    try:
        nv = host.nvml
    except Exception as e:
        info.errors.append(f"nvml: {e}")
        return
    try:
        info.driver_version = _s(nv.nvmlSystemGetDriverVersion())
    except Exception as e:
        info.errors.append(f"driver version: {e}")
    for fn, attr in (("nvmlSystemGetNVMLVersion", "nvml_version"),
                     ("nvmlSystemGetCudaDriverVersion", "cuda_driver_version")):
        try:
            v = getattr(nv, fn)()
            setattr(info, attr, _s(v) if attr == "nvml_version" else int(v))
        except Exception:
            pass
    try:
        n = nv.nvmlDeviceGetCount()
    except Exception as e:
        info.errors.append(f"device count: {e}")
        return
    for i in range(n):
        try:
            h = nv.nvmlDeviceGetHandleByIndex(i)
            g = GpuInfo(index=i, name=_s(nv.nvmlDeviceGetName(h)))
        except Exception as e:
            info.errors.append(f"gpu{i}: {e}")
            continue
        for fn, key in (("nvmlDeviceGetUUID", "uuid"),):
            try:
                setattr(g, key, _s(getattr(nv, fn)(h)))
            except Exception:
                pass
        try:
            g.pci_bus_id = _s(nv.nvmlDeviceGetPciInfo(h).busId)
        except Exception:
            pass
        try:
            m = int(nv.nvmlDeviceGetVirtualizationMode(h))
            g.virtualization_mode = NVML_VIRT_MODES.get(m, str(m))
        except Exception:
            pass
        for key, typ in (("graphics", 0), ("sm", 1), ("memory", 2)):
            try:
                g.max_clocks_mhz[key] = int(nv.nvmlDeviceGetMaxClockInfo(h, typ))
            except Exception:
                pass
        info.gpus.append(g)


def _systemd_detect_virt(host: Any, what: str) -> Optional[str]:
    """Only the host's own tool: a sim host's bin/ (tests), the real PATH on a real host; never
    the machine that runs a simulation."""
    if host.backend == "sim":
        exe = host.path("/bin/systemd-detect-virt")
        if not exe.exists():
            return None
    elif not shutil.which("systemd-detect-virt"):
        return None
    try:
        cp = host.run(["systemd-detect-virt", what], timeout=5)
    except (OSError, Exception):
        return None
    out = cp.stdout.strip()
    return out or None  # "none" (rc 1) on bare metal


def detect_virt(host: Any, gpus: list[GpuInfo]) -> VirtInfo:
    cpuinfo = _read(host, "/proc/cpuinfo") or ""
    flag = bool(re.search(r"^flags\s*:.*\bhypervisor\b", cpuinfo, re.M))
    vendor = _read(host, "/sys/class/dmi/id/sys_vendor")
    product = _read(host, "/sys/class/dmi/id/product_name")
    sdv = _systemd_detect_virt(host, "--vm")
    container = _systemd_detect_virt(host, "--container")
    nvml_mode = next((g.virtualization_mode for g in gpus if g.virtualization_mode), None)
    ev = []
    if flag:
        ev.append("cpuinfo hypervisor flag")
    if vendor and any(v in (vendor + " " + (product or "")).lower() for v in DMI_VM_VENDORS):
        ev.append(f"DMI {vendor} / {product}")
    if sdv and sdv != "none":
        ev.append(f"systemd-detect-virt: {sdv}")
    if nvml_mode in ("passthrough", "vgpu"):
        ev.append(f"NVML virtualization mode: {nvml_mode}")
    return VirtInfo(is_vm=bool(ev), hypervisor_flag=flag, dmi_vendor=vendor, dmi_product=product,
                    systemd_detect_virt=sdv,
                   container=container if container != "none" else None, nvml_virtualization_mode=nvml_mode, evidence=ev)


def detect(host: Any) -> HardwareInfo:
    info = HardwareInfo(backend=host.backend, virtualization=VirtInfo(is_vm=False,
                                                                      hypervisor_flag=False))
    detect_gpus(host, info)
    try:
        for d in list_devices(host):
            if d.kind in ("gpu", "nic", "bridge"):
                info.pcie.append(d.describe())
    except Exception as e:
        info.errors.append(f"pci: {e}")
    info.virtualization = detect_virt(host, info.gpus)
    m = re.search(r"^model name\s*:\s*(.+)$", _read(host, "/proc/cpuinfo") or "", re.M)
    info.cpu_model = m.group(1).strip() if m else None
    if not info.driver_version:
        v = _read(host, "/sys/module/nvidia/version")
        if v:
            info.driver_version = v
    return info
