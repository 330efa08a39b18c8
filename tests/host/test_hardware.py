"""Hardware detection: GPUs and driver through NVML (the fake on a sim host), PCIe devices with
their Device Control fields, and virtualisation from every source (cpuinfo hypervisor flag, DMI,
systemd-detect-virt when the host has it, NVML virtualisation mode)."""
from __future__ import annotations

import sys
from pathlib import Path

from tests.profiles import simhost
from tuner.host import hardware as hw
from tuner.host import Host
from tuner.sim.hostinit import init_host


def test_bare_metal_sim_host(tmp_path):
    root = init_host(tmp_path / "h", "h200")
    info = hw.detect(simhost.host(root))
    assert [g.name for g in info.gpus] == ["NVIDIA H200"]
    assert info.gpus[0].uuid.startswith("GPU-") and info.driver_version == "580.159.04"
    assert info.virtualization.is_vm is False and info.virtualization.evidence == []
    # the machine running the simulation is not asked (its systemd-detect-virt would say kvm)
    assert info.virtualization.systemd_detect_virt is None
    gpu = next(d for d in info.pcie if d["kind"] == "gpu")
    assert gpu["devctl"]["MaxReadReq"] in (128, 256, 512, 1024, 2048, 4096)
    assert info.gpu_name == "NVIDIA H200"


def test_vm_sim_host_all_evidence(tmp_path):
    root = init_host(tmp_path / "vm", "h200", vm=True)
    exe = root / "bin" / "systemd-detect-virt"
    exe.write_text(f"#!{sys.executable}\nimport sys\n"
                   "print('kvm' if '--vm' in sys.argv else 'none'); sys.exit(0 if '--vm' in sys.argv else 1)\n")
    exe.chmod(0o755)
    v = hw.detect(simhost.host(root)).virtualization
    assert v.is_vm and v.hypervisor_flag
    assert v.dmi_vendor == "QEMU"
    assert v.systemd_detect_virt == "kvm" and v.container is None
    assert "cpuinfo hypervisor flag" in v.evidence and "systemd-detect-virt: kvm" in v.evidence
    assert any(e.startswith("DMI QEMU") for e in v.evidence)


def test_nvml_virtualization_mode_alone_marks_a_vm(tmp_path):
    root = simhost.make(tmp_path / "h", pci=False)

    class Nv:
        def nvmlSystemGetDriverVersion(self): return "580.159.04"
        def nvmlDeviceGetCount(self): return 1
        def nvmlDeviceGetHandleByIndex(self, i): return i
        def nvmlDeviceGetName(self, h): return b"NVIDIA H200"
        def nvmlDeviceGetVirtualizationMode(self, h): return 1  # NVML_GPU_VIRTUALIZATION_MODE_PASSTHROUGH

    host = Host("sim", root, _nvml=Nv())
    info = hw.detect(host)
    assert info.gpus[0].virtualization_mode == "passthrough"
    assert info.virtualization.is_vm and info.virtualization.evidence == ["NVML virtualization mode: passthrough"]


def test_real_backend_never_fails_without_a_gpu():
    info = hw.detect(Host("real", Path("/")))
    assert info.backend == "real"
    if not info.gpus:
        assert any(e.startswith("nvml") for e in info.errors)
    assert isinstance(info.virtualization.is_vm, bool)
