"""A simulated host's OS part for tests of host knobs, profiles and detection: ostree.build()
plus a PCIe topology with real config-space bytes (root port -> switch -> GPU + NIC, and a NIC
under another root port that is not on the GPU's path)."""
from __future__ import annotations

import json
from pathlib import Path

from tuner.host import Host
from tuner.pci.config import build_config
from tuner.sim import ostree

GPU = "0000:17:00.0"
NIC_ON_PATH = "0000:18:00.0"
NIC_ELSEWHERE = "0000:3b:00.0"
SWITCH_UP, SWITCH_DOWN, ROOT_PORT, ROOT_PORT2 = "0000:15:00.0", "0000:16:00.0", "0000:00:01.0", "0000:00:03.0"


def make(root: Path, sku: str = "h200", vm: bool = False, pci: bool = True) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    if not (root / "host.json").exists():
        (root / "host.json").write_text(json.dumps({"sku": sku, "vm": vm, "gpus": 1}))
    ostree.build(root, sku, vm)
    if pci:
        add = ostree.add_pci_device
        add(root, ROOT_PORT, build_config(0x8086, 0x352A, 0x060400, port_type=4))
        add(root, ROOT_PORT2, build_config(0x8086, 0x352B, 0x060400, port_type=4))
        add(root, SWITCH_UP, build_config(0x10B5, 0xC010, 0x060400, port_type=5), parent=ROOT_PORT)
        add(root, SWITCH_DOWN, build_config(0x10B5, 0xC010, 0x060400, port_type=6), parent=SWITCH_UP)
        # devctl 0x2930: MaxReadReq 512, ExtTag, MaxPayload 256, RlxdOrd+, NoSnoop+
        add(root, GPU, build_config(0x10DE, 0x2335, 0x030200, devctl=0x2930), parent=SWITCH_DOWN,
            ro=vm)
        add(root, NIC_ON_PATH, build_config(0x15B3, 0x1021, 0x020000, devctl=0x2830),
            parent=SWITCH_DOWN, ro=vm)
        add(root, NIC_ELSEWHERE, build_config(0x15B3, 0x1021, 0x020000), parent=ROOT_PORT2, ro=vm)
    return root


def host(root: Path, dry_run: bool = False) -> Host:
    return Host("sim", root, dry_run=dry_run)
