"""The simulated GPU's PCIe config space is real bytes: the capability walk from 0x34 finds the PCIe
capability at 0x60 (as on the probed H200) with Device Control 0x5134, and lspci decodes them."""
from __future__ import annotations

import shutil
import struct
import subprocess

import pytest

from tests.sim.conftest import make_host
from tuner.sim.inject import inject


def _caps(cfg: bytes) -> dict[int, int]:
    out, p = {}, cfg[0x34]
    while p:
        out[cfg[p]] = p
        p = cfg[p + 1]
    return out


def _ext_caps(cfg: bytes) -> dict[int, int]:
    out, p = {}, 0x100
    while p:
        hdr = struct.unpack_from("<I", cfg, p)[0]
        out[hdr & 0xFFFF] = p
        p = hdr >> 20
    return out


def test_capability_walk_and_registers(tmp_path):
    root = make_host(tmp_path, gpus=2)
    dev = root / "sys/bus/pci/devices/0000:18:00.0"
    cfg = (dev / "config").read_bytes()
    assert len(cfg) == 4096
    assert struct.unpack_from("<HH", cfg, 0) == (0x10DE, 0x2335)
    assert (dev / "vendor").read_text() == "0x10de\n" and (dev / "class").read_text() == "0x030200\n"
    caps = _caps(cfg)
    assert caps[0x10] == 0x60 and {0x01, 0x05, 0x11} <= set(caps)
    devctl = struct.unpack_from("<H", cfg, 0x60 + 8)[0]
    assert devctl == 0x5134
    assert devctl & 0x10 and (devctl >> 5) & 7 == 1 and (devctl >> 12) & 7 == 5  # RO, 256, 4096
    lnksta = struct.unpack_from("<H", cfg, 0x60 + 0x12)[0]
    assert (lnksta & 0xF, (lnksta >> 4) & 0x3F) == (5, 16)
    assert (dev / "current_link_speed").read_text() == "32.0 GT/s PCIe\n"
    assert _ext_caps(cfg)[0x0001] == 0x100  # AER


def test_aer_injection_sets_status_bits_only(tmp_path):
    root = make_host(tmp_path)
    cfgp = root / "sys/bus/pci/devices/0000:18:00.0/config"
    before = cfgp.read_bytes()
    inject(root, "aer-correctable", ["3"])
    after = cfgp.read_bytes()
    assert struct.unpack_from("<I", after, 0x110)[0] == 1 << 6  # BadTLP in Correctable Status
    assert struct.unpack_from("<H", after, 0x60 + 0x0A)[0] & 0x1  # DevSta CorrErr
    assert struct.unpack_from("<H", after, 0x60 + 8)[0] == 0x5134  # Device Control untouched
    changed = [i for i in range(4096) if before[i] != after[i]]
    assert changed and all(i in (0x110, 0x6A) for i in changed)


@pytest.mark.skipif(not shutil.which("lspci"), reason="pciutils not installed")
def test_lspci_decodes_the_bytes(tmp_path):
    root = make_host(tmp_path)
    cfg = (root / "sys/bus/pci/devices/0000:18:00.0/config").read_bytes()
    dump = tmp_path / "dump"
    lines = ["18:00.0 3D controller: NVIDIA Corporation Device 2335 (rev a1)"]
    lines += [f"{o:03x}: " + " ".join(f"{b:02x}" for b in cfg[o:o + 16]) for o in range(0, 4096, 16)]
    dump.write_text("\n".join(lines) + "\n\n")
    out = subprocess.run(["lspci", "-F", str(dump), "-vvv"], capture_output=True, text=True).stdout
    assert "Capabilities: [60] Express (v2) Endpoint" in out
    assert "RlxdOrd+ ExtTag+" in out and "MaxPayload 256 bytes, MaxReadReq 4096 bytes" in out
    assert "LnkSta:\tSpeed 32GT/s, Width x16" in out
    assert "[100 v2] Advanced Error Reporting" in out
