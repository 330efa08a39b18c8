"""`metaltune sim init`: lay out a simulated host in a folder (layout: docs/INTERNALS.md)."""
from __future__ import annotations

import json
import os
import random
import time
import uuid as uuidlib
from pathlib import Path
from typing import Any

from tuner.errors import BadInput
from tuner.sim import model
from tuner.sim.pciconfig import GEN_SPEED, aer_text, build_config
from tuner.sim.skus import Sku, get_sku
from tuner.sim.state import SimState, atomic_write

DRIVER = "580.159.04"  # as on the probed H200
NVML_VERSION = "13.580.159.04"
CUDA_DRIVER = 13000


def gpu_uuid(seed: int, index: int) -> str:
    u = uuidlib.UUID(int=random.Random(f"metaltune-sim:{seed}:{index}:uuid").getrandbits(128))
    return f"GPU-{u}"


def new_gpu(sku: Sku, index: int, bdf: str, seed: int) -> dict[str, Any]:
    g: dict[str, Any] = {
        "index": index, "uuid": gpu_uuid(seed, index), "bdf": bdf,
        "serial": f"{1650000000000 + random.Random(f'{seed}:{index}:sn').randrange(10**9):013d}",
        "persistence": 1, "ecc_mode": 1 if sku.ecc else 0,
        **model.default_gpu_settings(sku),
        "chip": model.chip_params(sku, seed, index),
        "pcie_replay": 0,
        "ecc": {"volatile": {"corrected": 0, "uncorrected": 0},
                "aggregate": {"corrected": 0, "uncorrected": 0}},
        "remapped": {"correctable": 0, "uncorrectable": 0, "pending": 0, "failure": 0},
        "retired_pages": {"sbe": [], "dbe": []},
        "injected": {"thermal": False, "power_brake": False, "hang": False},
        "last_run": None,  # sensors of the last workload run: clock, power, temperature, reasons
        "busy": None,  # {"pid": ..., "since": ...} while a workload runs
        "processes": [],
    }
    return g


def init_host(root: str | os.PathLike[str], sku_name: str = "h200", vm: bool = False,
              gpus: int = 1, seed: int = 0, force: bool = False, os_tree: bool = True,
              boot_loader: str = "grub") -> Path:
    """Create the host. os_tree=False leaves out the CPU/OS/BMC tree of tuner.sim.ostree (tests of
    the GPU side only, where its few hundred files are just start-up time)."""
    sku = get_sku(sku_name)
    if not 1 <= gpus <= 8:
        raise BadInput(f"--gpus: expected 1..8, got {gpus}")
    root = Path(root).resolve()
    if root.exists() and not root.is_dir():
        raise BadInput(f"{root}: exists and is not a folder")
    if (root / "host.json").exists() and not force:
        raise BadInput(f"{root}: already a simulated host (host.json exists); pick a new folder")
    if root.exists() and any(root.iterdir()) and not force:
        raise BadInput(f"{root}: folder is not empty; pick a new or empty folder")
    (root / "nvml").mkdir(parents=True, exist_ok=True)
    bdfs = (sku.vm_bdfs if vm else sku.default_bdfs)[:gpus]
    now = time.time()
    state = {
        "version": 1, "sku": sku.name, "vm": vm, "seed": seed, "driver": DRIVER,
        "nvml_version": NVML_VERSION, "cuda_driver": CUDA_DRIVER, "boot_time": now,
        "counter": 0, "event_seq": 0, "kmsg_seq": 0,
        "gpus": [new_gpu(sku, i, bdf, seed) for i, bdf in enumerate(bdfs)],
    }
    atomic_write(root / "nvml" / "state.json", json.dumps(state, indent=1, sort_keys=True) + "\n")
    (root / "nvml" / "events.jsonl").touch()
    for g in state["gpus"]:
        _pci_device(root, sku, g["bdf"], vm)
    _proc(root, sku, vm)
    st = SimState(root)
    with st.edit() as s:
        for line in (f"NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  {DRIVER}  Release Build",
                     "nvidia-nvlink: Nvlink Core is being initialized, major device number 240"):
            st.add_kmsg(s, line, level=6)
    (root / "bin").mkdir(exist_ok=True)
    (root / "etc" / "modprobe.d").mkdir(parents=True, exist_ok=True)
    if os_tree:  # the CPU/OS tree and the BMC
        from tuner.sim import ostree

        ostree.build(root, sku.name, vm)
        if not vm:  # a cloud VM's boot is the provider's: no boot loader to try settings with
            from tuner.sim import boot

            boot.init(root, boot_loader)
    # host.json last: it marks a complete host
    atomic_write(root / "host.json", json.dumps({
        "sku": sku.name, "vm": vm, "seed": seed, "gpus": gpus, "created": now,
        "marketing_name": sku.marketing_name}, indent=1) + "\n")
    return root


def _pci_device(root: Path, sku: Sku, bdf: str, vm: bool) -> None:
    d = root / "sys" / "bus" / "pci" / "devices" / bdf
    d.mkdir(parents=True, exist_ok=True)
    (d / "config").write_bytes(build_config(sku, vm))
    files = {
        "vendor": "0x10de", "device": f"0x{sku.pci_device_id:04x}",
        "subsystem_vendor": "0x10de", "subsystem_device": f"0x{sku.pci_subsys:04x}",
        "class": f"0x{sku.pci_class:06x}", "revision": f"0x{sku.revision:02x}",
        "current_link_speed": GEN_SPEED[sku.pcie_gen], "max_link_speed": GEN_SPEED[sku.pcie_gen],
        "current_link_width": str(sku.pcie_width), "max_link_width": str(sku.pcie_width),
        "numa_node": "-1" if vm else "0", "driver_override": "(null)", "enable": "1",
    }
    for k, v in files.items():
        (d / k).write_text(v + "\n")
    if not vm:  # the probed VM has no AER files: the hypervisor owns error reporting
        for kind in ("correctable", "nonfatal", "fatal"):
            (d / f"aer_dev_{kind}").write_text(aer_text(kind, {}))
    if vm:
        for p in [d / "config", *[d / k for k in files]]:
            p.chmod(0o444)


def _proc(root: Path, sku: Sku, vm: bool) -> None:
    flags = ("fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx "
             "fxsr sse sse2 ss ht syscall nx pdpe1gb rdtscp lm constant_tsc rep_good nopl xtopology "
             "cpuid tsc_known_freq pni pclmulqdq ssse3 fma cx16 pcid sse4_1 sse4_2 x2apic movbe "
             "popcnt aes xsave avx f16c rdrand" + (" hypervisor" if vm else "") +
             " lahf_lm abm 3dnowprefetch avx2 smep bmi1 bmi2 erms invpcid avx512f avx512dq")
    ncpu = 4 if vm else 8
    text = "".join(
        f"processor\t: {i}\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 143\n"
        f"model name\t: Intel(R) Xeon(R) Platinum 8480+\nstepping\t: 8\ncpu MHz\t\t: 2000.000\n"
        f"cache size\t: 107520 KB\nphysical id\t: 0\nsiblings\t: {ncpu}\ncore id\t\t: {i}\n"
        f"cpu cores\t: {ncpu}\nflags\t\t: {flags}\n\n" for i in range(ncpu))
    p = root / "proc" / "cpuinfo"
    p.parent.mkdir(parents=True, exist_ok=True)
    if not p.exists():  # ostree may write a richer one
        p.write_text(text)
    b = root / "proc" / "sys" / "kernel" / "random"
    b.mkdir(parents=True, exist_ok=True)
    if not (b / "boot_id").exists():
        (b / "boot_id").write_text(str(uuidlib.uuid4()) + "\n")
    (root / "dev").mkdir(exist_ok=True)
    (root / "dev" / "kmsg").touch()
