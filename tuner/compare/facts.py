"""Host facts that explain why two hosts measure differently: virtualisation and hypervisor, GPU
passthrough mode, PCIe generation/width and relaxed ordering, IOMMU, NUMA, CPU model, driver.

Read-only. Works on the real machine and on a simulated host through the same `Host` (paths under
its root, its NVML). Every fact is best effort: a missing file or NVML call gives None, and how a
conclusion was reached is kept in `evidence` so a reader can check it.
"""
from __future__ import annotations

import os
import platform
import re
from pathlib import Path
from typing import Any

#: nvmlGpuVirtualizationMode_t
VIRT_MODES = {0: "none", 1: "passthrough", 2: "vgpu", 3: "host-vgpu", 4: "host-vsga"}
#: PCIe link speed code (Link Status bits 0-3) -> generation
_GT_TO_GEN = {"2.5": 1, "5.0": 2, "8.0": 3, "16.0": 4, "32.0": 5, "64.0": 6}
#: PCI host bridges that name a hypervisor (vendor:device)
_HOST_BRIDGES = {
    "0x8086:0x0d57": "firecracker/cloud-hypervisor",  # their PCI root; Firecracker reuses it
    "0x8086:0x1237": "qemu (i440fx)",
    "0x8086:0x29c0": "qemu (q35)",
}
_DMI_VENDORS = [
    ("qemu", "qemu"), ("kvm", "kvm"), ("amazon ec2", "kvm (aws nitro)"), ("google", "kvm (gce)"),
    ("microsoft corporation", "hyper-v"), ("vmware", "vmware"), ("xen", "xen"),
    ("innotek", "virtualbox"), ("cloud hypervisor", "cloud-hypervisor"),
]


def _read(path: Path, binary: bool = False) -> Any:
    try:
        return path.read_bytes() if binary else path.read_text(errors="replace").strip()
    except OSError:
        return None


def collect(host: Any) -> dict[str, Any]:
    """All facts for `host` (a tuner.host.Host) as a flat-ish JSON-able dict."""
    evidence: list[str] = []
    facts: dict[str, Any] = {"backend": host.backend}
    facts.update(_cpu(host, evidence))
    facts.update(_kernel(host))
    facts["numa_nodes"] = _count(host.path("/sys/devices/system/node"), r"node\d+")
    facts["iommu"] = _iommu(host, evidence)
    gpus = _gpus(host, evidence)
    facts["gpus"] = gpus
    facts["gpu_count"] = len(gpus)
    facts["gpu_name"] = gpus[0].get("name") if gpus else None
    facts["driver"] = _driver(host)
    facts.update(_virt(host, facts, gpus, evidence))
    _merge_hw(host, facts, evidence)
    if gpus:  # the first GPU's link, flattened so two hosts' facts compare key by key
        g = gpus[0]
        for k in ("pcie_gen", "pcie_width", "pcie_max_gen", "pcie_max_width", "relaxed_ordering",
                  "max_read_request_bytes", "max_payload_bytes", "numa_node", "virtualization_mode"):
            facts[f"gpu0_{k}"] = g.get(k)
    facts["evidence"] = evidence
    return facts


def _merge_hw(host: Any, facts: dict[str, Any], ev: list[str]) -> None:
    """The project's hardware detection (tuner.host.hardware, the one `match:` rules use) where it can run:
    its verdict is kept beside ours and a VM either one sees is a VM. It needs pydantic, which a
    GPU host's own Python may lack; then this module's stdlib reading stands alone."""
    try:
        from tuner.host import hardware as hw
    except ImportError as e:
        ev.append(f"tuner.host.hardware not used ({e})")
        return
    try:
        info = hw.detect(host)
    except Exception as e:
        ev.append(f"tuner.host.hardware failed: {type(e).__name__}: {e}")
        return
    v = info.virtualization
    facts["hw_detect"] = {"is_vm": v.is_vm, "evidence": v.evidence,
                          "systemd_detect_virt": v.systemd_detect_virt,
                          "nvml_virtualization_mode": v.nvml_virtualization_mode,
                          "driver": info.driver_version, "cuda_driver": info.cuda_driver_version}
    if v.is_vm and facts.get("virtualisation") != "vm":
        facts["virtualisation"] = "vm"
        facts["hypervisor"] = facts.get("hypervisor") or v.systemd_detect_virt or "unknown"
        ev.append("tuner.host.hardware says VM: " + "; ".join(v.evidence))
    facts["driver"] = facts.get("driver") or info.driver_version
    facts["cuda_driver"] = info.cuda_driver_version


def _cpu(host: Any, ev: list[str]) -> dict[str, Any]:
    text = _read(host.path("/proc/cpuinfo")) or ""
    model = None
    cpus = 0
    flags: set[str] = set()
    for line in text.splitlines():
        k, _, v = line.partition(":")
        k = k.strip()
        if k == "model name" and model is None:
            model = v.strip()
        elif k == "processor":
            cpus += 1
        elif k == "flags" and not flags:
            flags = set(v.split())
    if "hypervisor" in flags:
        ev.append("/proc/cpuinfo has the 'hypervisor' flag")
    mem = None
    for line in (_read(host.path("/proc/meminfo")) or "").splitlines():
        if line.startswith("MemTotal:"):
            mem = round(int(line.split()[1]) / 1024 / 1024, 1)
    return {"cpu_model": model, "cpu_count": cpus or (os.cpu_count() if host.backend == "real" else None),
            "hypervisor_flag": "hypervisor" in flags, "mem_total_gib": mem}


def _kernel(host: Any) -> dict[str, Any]:
    rel = _read(host.path("/proc/sys/kernel/osrelease"))
    if rel is None and host.backend == "real":
        rel = platform.release()
    return {"kernel": rel, "cmdline": _read(host.path("/proc/cmdline"))}


def _count(d: Path, pattern: str) -> int | None:
    try:
        return sum(1 for p in d.iterdir() if re.fullmatch(pattern, p.name))
    except OSError:
        return None


def _iommu(host: Any, ev: list[str]) -> dict[str, Any]:
    units = _count(host.path("/sys/class/iommu"), r".+")
    groups = _count(host.path("/sys/kernel/iommu_groups"), r"\d+")
    cmd = _read(host.path("/proc/cmdline")) or ""
    opts = [w for w in cmd.split() if w.startswith(("iommu", "intel_iommu", "amd_iommu"))]
    on = bool(units) or bool(groups)
    ev.append(f"iommu: {units or 0} units in /sys/class/iommu, {groups or 0} groups"
              + (f", cmdline {' '.join(opts)}" if opts else ""))
    return {"enabled": on, "units": units, "groups": groups, "cmdline": opts or None}


# -- PCIe config space ------------------------------------------------------------------------
def parse_pcie_config(cfg: bytes) -> dict[str, Any]:
    """Relaxed ordering, max payload / read request and link status from config-space bytes,
    decoded by tuner.pci.config (the PCI Express capability's Device Control and Link Status)."""
    from tuner.pci import config as pcicfg

    try:
        dc = pcicfg.decode_devctl(cfg)
        link = pcicfg.link_status(cfg)
    except pcicfg.ConfigError:
        return {}
    return {"devctl": f"0x{dc.raw:04x}", "relaxed_ordering": dc.RlxdOrd,
            "max_payload_bytes": dc.MaxPayload, "max_read_request_bytes": dc.MaxReadReq,
            "cfg_link_gen": link["speed_gen"], "cfg_link_width": link["width"]}


def _pci_devices(host: Any) -> list[Path]:
    d = host.path("/sys/bus/pci/devices")
    try:
        return sorted(d.iterdir())
    except OSError:
        return []


def _gen(speed: str | None) -> int | None:
    m = re.match(r"([\d.]+) GT/s", speed or "")
    return _GT_TO_GEN.get(m.group(1)) if m else None


def _gpus(host: Any, ev: list[str]) -> list[dict[str, Any]]:
    """NVIDIA GPUs from NVML (name, virtualisation mode, link) merged with their sysfs entry."""
    nv = None
    try:
        nv = host.nvml
    except Exception as e:
        ev.append(f"NVML unavailable: {e}")
    by_bdf: dict[str, dict[str, Any]] = {}
    if nv is not None:
        try:
            n = nv.nvmlDeviceGetCount()
        except Exception:
            n = 0
        for i in range(n):
            g: dict[str, Any] = {"index": i}
            try:
                h = nv.nvmlDeviceGetHandleByIndex(i)
            except Exception:
                continue
            for key, fn in (("name", "nvmlDeviceGetName"), ("virt", "nvmlDeviceGetVirtualizationMode"),
                            ("pcie_gen", "nvmlDeviceGetCurrPcieLinkGeneration"),
                            ("pcie_width", "nvmlDeviceGetCurrPcieLinkWidth"),
                            ("pcie_max_gen", "nvmlDeviceGetMaxPcieLinkGeneration"),
                            ("pcie_max_width", "nvmlDeviceGetMaxPcieLinkWidth"),
                            ("pci", "nvmlDeviceGetPciInfo")):
                try:
                    g[key] = getattr(nv, fn)(h)
                except Exception:
                    pass
            if isinstance(g.get("name"), bytes):
                g["name"] = g["name"].decode()
            if "virt" in g:
                g["virtualization_mode"] = VIRT_MODES.get(int(g.pop("virt")), "unknown")
            pci = g.pop("pci", None)
            bdf = _bdf_of(pci)
            g["bdf"] = bdf
            by_bdf[bdf or f"nvml{i}"] = g
    # sysfs: NVIDIA display/3D controllers (vendor 0x10de, class 0x03xxxx)
    for dev in _pci_devices(host):
        vendor = _read(dev / "vendor")
        cls = _read(dev / "class") or ""
        if vendor != "0x10de" or not cls.startswith("0x03"):
            continue
        bdf = dev.name.lower()
        g = by_bdf.setdefault(bdf, {"bdf": bdf})
        g["pci_id"] = f"{vendor}:{_read(dev / 'device')}"
        g.setdefault("pcie_gen", _gen(_read(dev / "current_link_speed")))
        g.setdefault("pcie_max_gen", _gen(_read(dev / "max_link_speed")))
        for k, f in (("pcie_width", "current_link_width"), ("pcie_max_width", "max_link_width")):
            v = _read(dev / f)
            if g.get(k) is None and v and v.isdigit():
                g[k] = int(v)
        numa = _read(dev / "numa_node")
        g["numa_node"] = int(numa) if numa and numa.lstrip("-").isdigit() else None
        cfg = _read(dev / "config", binary=True)
        if cfg:
            g.update(parse_pcie_config(cfg))
            if len(cfg) <= 64:
                ev.append(f"{bdf}: only {len(cfg)} bytes of config space readable (not root?)")
        g["iommu_group"] = (os.path.basename(os.readlink(dev / "iommu_group"))
                            if (dev / "iommu_group").is_symlink() else None)
    gpus = sorted(by_bdf.values(), key=lambda g: (g.get("index", 99), g.get("bdf") or ""))
    return gpus


def _bdf_of(pci: Any) -> str | None:
    if pci is None:
        return None
    raw = getattr(pci, "busIdLegacy", None) or getattr(pci, "busId", None)
    if isinstance(pci, dict):
        raw = pci.get("busId") or pci.get("bus_id")
    if isinstance(raw, bytes):
        raw = raw.decode()
    if not raw:
        return None
    m = re.search(r"([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])", raw)
    return f"{int(m.group(1), 16):04x}:{m.group(2)}:{m.group(3)}.{m.group(4)}".lower() if m else raw


def _driver(host: Any) -> str | None:
    try:
        v = host.nvml.nvmlSystemGetDriverVersion()
        return v.decode() if isinstance(v, bytes) else str(v)
    except Exception:
        pass
    txt = _read(host.path("/sys/module/nvidia/version")) or _read(host.path("/proc/driver/nvidia/version"))
    if txt:
        m = re.search(r"(\d+\.\d+(?:\.\d+)?)", txt)
        return m.group(1) if m else txt
    return None


def _virt(host: Any, facts: dict[str, Any], gpus: list[dict[str, Any]], ev: list[str]) -> dict[str, Any]:
    """Bare metal or VM, which hypervisor, and how the GPU reaches the guest."""
    hyper: str | None = None
    container = None
    if host.backend == "real":
        for flag in ("--vm", "--container"):
            try:
                r = host.run(["systemd-detect-virt", flag], timeout=5)
            except Exception:
                ev.append("systemd-detect-virt: not installed")
                break
            out = r.stdout.strip() or None
            ev.append(f"systemd-detect-virt {flag}: {out}")
            if out and out != "none":
                if flag == "--vm":
                    hyper = out
                else:
                    container = out
    xen = _read(host.path("/sys/hypervisor/type"))
    if xen and not hyper:
        hyper = xen
        ev.append(f"/sys/hypervisor/type: {xen}")
    dmi_vendor = _read(host.path("/sys/class/dmi/id/sys_vendor"))
    dmi_product = _read(host.path("/sys/class/dmi/id/product_name"))
    if dmi_vendor is None and dmi_product is None:
        ev.append("no DMI (/sys/class/dmi/id missing)")
    else:
        ev.append(f"DMI: {dmi_vendor} / {dmi_product}")
        both = f"{dmi_vendor} {dmi_product}".lower()
        for key, name in _DMI_VENDORS:
            if key in both and not hyper:
                hyper = name
    bridge = None
    virtio = 0
    for dev in _pci_devices(host):
        vid, did, cls = _read(dev / "vendor"), _read(dev / "device"), _read(dev / "class") or ""
        if vid == "0x1af4":
            virtio += 1
        if cls.startswith("0x0600") and f"{vid}:{did}" in _HOST_BRIDGES:
            bridge = f"{vid}:{did}"
    if virtio:
        ev.append(f"{virtio} virtio PCI devices (vendor 0x1af4)")
    fc_cmdline = "firecracker" in (facts.get("cmdline") or "").lower()
    if fc_cmdline:
        ev.append("kernel command line names firecracker")
    if bridge:
        ev.append(f"PCI host bridge {bridge} ({_HOST_BRIDGES[bridge]})")
    vmm = None
    # Firecracker exposes no SMBIOS/DMI at all (cloud-hypervisor does) and reuses
    # cloud-hypervisor's PCI root; its guest kernels are often named "-fc-"
    no_dmi = dmi_vendor is None and dmi_product is None
    if fc_cmdline or (bridge and _HOST_BRIDGES[bridge].startswith("firecracker") and no_dmi):
        vmm = "firecracker"
    elif bridge:
        vmm = _HOST_BRIDGES[bridge]
    elif "-fc-" in (facts.get("kernel") or "") and facts.get("hypervisor_flag"):
        vmm = "firecracker"
        ev.append(f"kernel release {facts['kernel']} looks like a Firecracker guest kernel")
    if vmm and hyper and vmm != hyper:
        hyper = f"{vmm} ({hyper})"
    elif vmm:
        hyper = vmm
    is_vm = bool(facts.get("hypervisor_flag") or hyper or virtio)
    if is_vm and not hyper:
        hyper = "unknown"
    modes = sorted({g.get("virtualization_mode") for g in gpus if g.get("virtualization_mode")})
    if modes:
        passthrough = modes[0] if len(modes) == 1 else ",".join(modes)
        ev.append(f"NVML virtualization mode: {passthrough}")
    elif gpus:
        passthrough = "passthrough" if is_vm else "none"
        ev.append("NVML virtualization mode unavailable: passthrough inferred from the VM verdict")
    else:
        passthrough = None
    return {"virtualisation": "vm" if is_vm else "bare-metal", "hypervisor": hyper,
            "container": container, "gpu_passthrough": passthrough}
