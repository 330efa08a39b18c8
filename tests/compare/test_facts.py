"""Host facts read from a sysfs/procfs-shaped tree: what decides "bare metal or VM, which
hypervisor, how the GPU is attached"."""
from pathlib import Path

from tuner.compare.facts import collect, parse_pcie_config
from tuner.host import Host
from tuner.pci import config as pcicfg

H200_DEVCTL = 0x5134  # read on the real H200 (docs/readings): RO on, payload 256, MRRS 4096


def _w(p: Path, text: str | bytes) -> None:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(text) if isinstance(text, bytes) else p.write_text(text)


def _tree(root: Path, *, hypervisor: bool, dmi: tuple[str, str] | None, bridge: str,
          devctl: int, gen_gts: str = "32.0 GT/s PCIe", width: int = 16, iommu_groups: int = 0) -> Host:
    flags = "fpu sse2 avx2" + (" hypervisor" if hypervisor else "")
    _w(root / "proc/cpuinfo", "".join(f"processor\t: {i}\nmodel name\t: Test CPU 9000\nflags\t\t: {flags}\n\n"
                                      for i in range(4)))
    _w(root / "proc/meminfo", "MemTotal:       16777216 kB\n")
    _w(root / "proc/sys/kernel/osrelease", "6.1.0-test\n")
    _w(root / "proc/cmdline", "ro quiet\n")
    for n in range(2):
        (root / f"sys/devices/system/node/node{n}").mkdir(parents=True)
    if dmi:
        _w(root / "sys/class/dmi/id/sys_vendor", dmi[0] + "\n")
        _w(root / "sys/class/dmi/id/product_name", dmi[1] + "\n")
    for g in range(iommu_groups):
        (root / f"sys/kernel/iommu_groups/{g}").mkdir(parents=True)
    d = root / "sys/bus/pci/devices"
    vid, did = bridge.split(":")
    _w(d / "0000:00:00.0/vendor", vid + "\n")
    _w(d / "0000:00:00.0/device", did + "\n")
    _w(d / "0000:00:00.0/class", "0x060000\n")
    g = d / "0000:17:00.0"
    _w(g / "vendor", "0x10de\n")
    _w(g / "device", "0x2335\n")
    _w(g / "class", "0x030200\n")
    _w(g / "current_link_speed", gen_gts + "\n")
    _w(g / "current_link_width", f"{width}\n")
    _w(g / "max_link_speed", "32.0 GT/s PCIe\n")
    _w(g / "max_link_width", "16\n")
    _w(g / "numa_node", "1\n")
    _w(g / "config", pcicfg.build_config(0x10DE, 0x2335, 0x030200, devctl=devctl))
    (root / "host.json").write_text("{}")
    return Host("sim", root)  # a rooted host: paths under `root`, no NVML there


def test_pcie_devctl_decoding_matches_the_h200_reading():
    f = parse_pcie_config(pcicfg.build_config(0x10DE, 0x2335, 0x030200, devctl=H200_DEVCTL))
    assert f["relaxed_ordering"] is True
    assert f["max_read_request_bytes"] == 4096 and f["max_payload_bytes"] == 256
    off = parse_pcie_config(pcicfg.build_config(0x10DE, 0x2335, 0x030200, devctl=H200_DEVCTL & ~0x10))
    assert off["relaxed_ordering"] is False
    assert parse_pcie_config(b"\x00" * 64) == {}


def test_firecracker_guest_with_passed_through_gpu(tmp_path):
    host = _tree(tmp_path, hypervisor=True, dmi=None, bridge="0x8086:0x0d57", devctl=H200_DEVCTL)
    f = collect(host)
    assert f["virtualisation"] == "vm"
    assert f["hypervisor"] == "firecracker"
    assert f["gpu_passthrough"] == "passthrough"          # inferred: NVML is not there
    assert f["gpu0_pcie_gen"] == 5 and f["gpu0_pcie_width"] == 16
    assert f["gpu0_relaxed_ordering"] is True and f["gpu0_max_read_request_bytes"] == 4096
    assert f["cpu_model"] == "Test CPU 9000" and f["cpu_count"] == 4 and f["numa_nodes"] == 2
    assert f["iommu"]["enabled"] is False
    assert any("no DMI" in e for e in f["evidence"])


def test_bare_metal_server(tmp_path):
    host = _tree(tmp_path, hypervisor=False, dmi=("Supermicro", "SYS-821GE-TNHR"),
                 bridge="0x8086:0x09a2", devctl=0x2800, gen_gts="16.0 GT/s PCIe", width=8,
                 iommu_groups=3)
    f = collect(host)
    assert f["virtualisation"] == "bare-metal" and f["hypervisor"] is None
    assert f["gpu_passthrough"] == "none"
    assert f["gpu0_pcie_gen"] == 4 and f["gpu0_pcie_width"] == 8
    assert f["gpu0_relaxed_ordering"] is False
    assert f["iommu"] == {"enabled": True, "units": None, "groups": 3, "cmdline": None}
    assert f["gpu0_numa_node"] == 1


def test_qemu_guest_named_by_dmi(tmp_path):
    host = _tree(tmp_path, hypervisor=True, dmi=("QEMU", "Standard PC (Q35 + ICH9, 2009)"),
                 bridge="0x8086:0x29c0", devctl=0x2810)
    f = collect(host)
    assert f["virtualisation"] == "vm" and f["hypervisor"].startswith("qemu")
