"""The OS part of a simulated host: cpufreq/boost/cpuidle, THP, sysctls, /proc/cpuinfo, DMI,
modprobe.d, the NVIDIA driver's params file, and the BIOS double under DIR/bmc.

`metaltune sim init` calls `build(root, sku, vm)`. The files look like the kernel's (same names,
same formats, e.g. `always [madvise] never`), so the real knob code reads them unchanged. In `vm`
mode the tunables are made read-only (mode 0444, as sysfs shows attributes a guest cannot change)
and there is no BMC, as in a cloud VM.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tuner.pci import config as pcicfg

#: per SKU: CPU count, cpufreq driver style, DMI, sysctl defaults
SKUS: dict[str, dict[str, Any]] = {
    "h200": {"cpus": 8, "pstate": "intel", "vendor": "Supermicro", "product": "SYS-821GE-TNHR",
             "cpu_model": "Intel(R) Xeon(R) Platinum 8480+",
             "idle": [("POLL", 0), ("C1", 2), ("C1E", 10), ("C6", 170)]},
    "rtx4090": {"cpus": 4, "pstate": "amd", "vendor": "ASUSTeK COMPUTER INC.",
                "product": "System Product Name", "cpu_model": "AMD Ryzen 9 7950X 16-Core Processor",
                "idle": [("POLL", 0), ("C1", 1), ("C2", 18), ("C3", 350)]},
}
VM_DMI = ("QEMU", "Standard PC (Q35 + ICH9, 2009)")

SYSCTLS = {
    "kernel/numa_balancing": "1", "vm/swappiness": "60", "vm/zone_reclaim_mode": "0",
    "vm/max_map_count": "65530", "vm/dirty_ratio": "20", "vm/dirty_background_ratio": "10",
    "vm/stat_interval": "1", "kernel/sched_autogroup_enabled": "1", "kernel/nmi_watchdog": "1",
    "net/core/rmem_max": "212992", "net/core/wmem_max": "212992",
    "net/core/netdev_max_backlog": "1000",
}


def _w(p: Path, text: str, ro: bool = False) -> Path:
    p.parent.mkdir(parents=True, exist_ok=True)
    if p.exists():
        os.chmod(p, 0o644)
    p.write_text(text if text.endswith("\n") else text + "\n")
    os.chmod(p, 0o444 if ro else 0o644)
    return p


def build(root: Path, sku: str = "h200", vm: bool = False) -> None:
    root = Path(root)
    spec = SKUS.get(sku, SKUS["h200"])
    ncpu = 4 if vm else spec["cpus"]  # a VM gets fewer vCPUs (as `sim init` writes in cpuinfo)
    cpu = root / "sys/devices/system/cpu"
    for i in range(ncpu):
        d = cpu / f"cpu{i}"
        f = d / "cpufreq"
        if spec["pstate"] == "intel":
            _w(f / "scaling_available_governors", "performance powersave", ro=True)
            _w(f / "scaling_governor", "powersave", ro=vm)
            _w(f / "energy_performance_available_preferences",
               "default performance balance_performance balance_power power", ro=True)
            _w(f / "energy_performance_preference", "balance_performance", ro=vm)
            _w(f / "scaling_driver", "intel_pstate", ro=True)
        else:
            _w(f / "scaling_available_governors", "conservative ondemand userspace powersave "
               "performance schedutil", ro=True)
            _w(f / "scaling_governor", "schedutil", ro=vm)
            _w(f / "scaling_driver", "acpi-cpufreq", ro=True)
        _w(f / "cpuinfo_max_freq", "3800000", ro=True)
        for j, (name, lat) in enumerate(spec["idle"]):
            s = d / "cpuidle" / f"state{j}"
            _w(s / "name", name, ro=True)
            _w(s / "latency", str(lat), ro=True)
            _w(s / "disable", "0", ro=vm)
    _w(cpu / "online", f"0-{ncpu - 1}", ro=True)
    if spec["pstate"] == "intel":
        _w(cpu / "intel_pstate/no_turbo", "0", ro=vm)
        _w(cpu / "intel_pstate/status", "active", ro=True)
    else:
        _w(cpu / "cpufreq/boost", "1", ro=vm)

    _w(root / "sys/kernel/mm/transparent_hugepage/enabled", "[always] madvise never", ro=vm)
    _w(root / "sys/kernel/mm/transparent_hugepage/defrag",
       "always defer defer+madvise [madvise] never", ro=vm)
    for k, v in SYSCTLS.items():
        _w(root / "proc/sys" / k, v, ro=vm)

    if not (root / "proc/cpuinfo").exists():  # `sim init` writes its own: keep it
        flags = ("fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 "
                 "clflush mmx fxsr sse sse2 ss ht syscall nx pdpe1gb rdtscp lm constant_tsc "
                 + ("hypervisor " if vm else "") + "avx avx2 avx512f")
        vendor_id = "GenuineIntel" if spec["pstate"] == "intel" else "AuthenticAMD"
        _w(root / "proc/cpuinfo", "".join(
            f"processor\t: {i}\nvendor_id\t: {vendor_id}\nmodel name\t: {spec['cpu_model']}\n"
            f"flags\t\t: {flags}\n\n" for i in range(ncpu)), ro=True)
    vendor, product = VM_DMI if vm else (spec["vendor"], spec["product"])
    _w(root / "sys/class/dmi/id/sys_vendor", vendor, ro=True)
    _w(root / "sys/class/dmi/id/product_name", product, ro=True)
    _w(root / "dev/cpu_dma_latency", "", ro=vm)

    mp = root / "etc/modprobe.d"
    mp.mkdir(parents=True, exist_ok=True)
    _w(mp / "nvidia.conf", "# distribution default\noptions nvidia NVreg_PreserveVideoMemoryAllocations=1")
    os.chmod(mp, 0o555 if vm else 0o755)
    _w(root / "proc/driver/nvidia/params",
       "ResmanDebugLevel: 4294967295\nEnablePCIeGen3: 0\nEnablePCIERelaxedOrderingMode: 0\n"
       "EnableMSI: 1\nPreserveVideoMemoryAllocations: 1\n", ro=True)
    _w(root / "proc/driver/nvidia/version",
       "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build\n",
       ro=True)

    if not vm:
        from tuner.sim import bmc

        bmc.init(root)
        _w(root / "etc/metaltune/bmc.yaml",
           "# the simulated host's BMC double (tuner/sim/bmc.py), answered in-process\n"
           "method: redfish\nurl: sim-bmc://local\n")
    (root / "bin").mkdir(exist_ok=True)


def add_pci_device(root: Path, bdf: str, cfg: bytes, parent: str | None = None,
                   ro: bool = False) -> Path:
    """A PCI function under DIR/sys/bus/pci/devices (tests, topologies with switches and NICs).
    `parent` names the upstream bridge's BDF (a real tree encodes that in the sysfs link)."""
    d = Path(root) / "sys/bus/pci/devices" / bdf
    d.mkdir(parents=True, exist_ok=True)
    vendor, device = pcicfg.u16(cfg, 0), pcicfg.u16(cfg, 2)
    cls = int.from_bytes(cfg[9:12], "little")
    _w(d / "vendor", f"0x{vendor:04x}", ro=True)
    _w(d / "device", f"0x{device:04x}", ro=True)
    _w(d / "class", f"0x{cls:06x}", ro=True)
    if parent:
        _w(d / "parent", parent, ro=True)
    cp = d / "config"
    if cp.exists():
        os.chmod(cp, 0o644)
    cp.write_bytes(cfg)
    os.chmod(cp, 0o444 if ro else 0o644)
    return d
