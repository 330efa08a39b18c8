"""`metaltune sim inject DIR EVENT [ARGS]`: disturb a simulated host the way failing hardware does.

Events leave the traces a real host shows: NVML counters and events, kernel log lines (NVRM Xid,
AER), sysfs AER counters and the AER/Device Status bits in PCIe config space. Conditions (thermal,
power-brake, hang) stay until `clear` (hang: until the next workload or canary run).
"""
from __future__ import annotations

import os
import struct
from typing import Any

import pynvml

from tuner.errors import BadInput
from tuner.sim.events import queue_xid
from tuner.sim.pciconfig import AER_CAP, AER_COR_BIT, AER_UNC_BIT, PCIE_CAP, aer_text, parse_aer
from tuner.sim.skus import get_sku
from tuner.sim.state import SimState

EVENTS = {
    "xid": "xid N: an Xid N error (NVML event + NVRM kmsg line)",
    "ecc-sbe": "ecc-sbe [N]: N corrected (single-bit) ECC errors",
    "ecc-dbe": "ecc-dbe [N]: N uncorrected (double-bit) ECC errors (+ Xid 94, row remap pending)",
    "thermal": "thermal: temperature over the slowdown threshold, HW thermal slowdown active",
    "power-brake": "power-brake: HW power brake slowdown active",
    "hang": "hang: the next workload or canary run blocks until its timeout",
    "pcie-replay": "pcie-replay N: N PCIe replays",
    "aer-correctable": "aer-correctable [N]: N correctable AER errors (BadTLP)",
    "aer-nonfatal": "aer-nonfatal [N]: N non-fatal uncorrectable AER errors (completion timeout)",
    "aer-fatal": "aer-fatal [N]: N fatal AER errors (malformed TLP)",
    "busy": "busy [PID]: a tenant process (default: the caller's parent) keeps the GPU busy "
            "(utilisation 100 %, listed as a compute process) until `idle` or it exits",
    "idle": "idle: the tenant processes leave the GPU",
    "clear": "clear: end the injected conditions (thermal, power-brake, hang, busy)",
}
_AER = {"aer-correctable": ("correctable", "BadTLP", "Corrected", "Data Link Layer"),
        "aer-nonfatal": ("nonfatal", "CmpltTO", "Uncorrected (Non-Fatal)", "Transaction Layer"),
        "aer-fatal": ("fatal", "MalfTLP", "Uncorrected (Fatal)", "Transaction Layer")}


def _count(event: str, args: list[str], default: int | None) -> int:
    if not args:
        if default is None:
            raise BadInput(f"sim inject {event}: expected a number, e.g. `{EVENTS[event].split(':')[0]}`")
        return default
    if len(args) > 1:
        raise BadInput(f"sim inject {event}: expected one number, got {' '.join(args)!r}")
    try:
        n = int(args[0])
    except ValueError:
        raise BadInput(f"sim inject {event}: expected a whole number, got {args[0]!r}") from None
    if n < 1 or (event == "xid" and n > 999):
        raise BadInput(f"sim inject {event}: expected {'1..999' if event == 'xid' else '>= 1'}, got {n}")
    return n


def inject(root: str | os.PathLike[str], event: str, args: list[str] | None = None,
           gpu: int = 0) -> dict[str, Any]:
    args = list(args or [])
    if event not in EVENTS:
        raise BadInput(f"sim inject: unknown event {event!r}; expected one of: {', '.join(EVENTS)}")
    state = SimState(root)
    state.check()
    snap = state.read()
    if not 0 <= gpu < len(snap["gpus"]):
        raise BadInput(f"sim inject --gpu: expected 0..{len(snap['gpus']) - 1}, got {gpu}")
    sku = get_sku(snap["sku"])
    if event in ("thermal", "power-brake", "hang", "clear", "idle") and args:
        raise BadInput(f"sim inject {event}: takes no arguments, got {' '.join(args)!r}")
    n = _count(event, args, None if event in ("xid", "pcie-replay") else 1) \
        if event not in ("thermal", "power-brake", "hang", "clear", "idle", "busy") else 0
    if event == "busy":
        n = _count("busy", args, os.getppid())
        try:
            os.kill(n, 0)
        except ProcessLookupError:
            raise BadInput(f"sim inject busy: no process {n}") from None
        except PermissionError:
            pass
    if event.startswith("ecc") and not sku.ecc:
        raise BadInput(f"sim inject {event}: ECC is off on this {sku.marketing_name}")
    bdf = snap["gpus"][gpu]["bdf"]
    dev = state.root / "sys" / "bus" / "pci" / "devices" / bdf
    if event.startswith("aer") and not (dev / "aer_dev_correctable").exists():
        raise BadInput(f"sim inject {event}: {bdf} has no AER reporting here "
                       f"(a VM host: the hypervisor owns PCIe error reporting)")

    with state.edit() as st:
        g = st["gpus"][gpu]
        inj = g.setdefault("injected", {})
        if event == "xid":
            queue_xid(state, st, gpu, n)
        elif event == "ecc-sbe":
            for c in ("volatile", "aggregate"):
                g["ecc"][c]["corrected"] += n
            state.add_event(st, gpu, pynvml.nvmlEventTypeSingleBitEccError, n)
        elif event == "ecc-dbe":
            for c in ("volatile", "aggregate"):
                g["ecc"][c]["uncorrected"] += n
            g["remapped"]["uncorrectable"] += n
            g["remapped"]["pending"] = 1
            state.add_event(st, gpu, pynvml.nvmlEventTypeDoubleBitEccError, n)
            queue_xid(state, st, gpu, 94)
            queue_xid(state, st, gpu, 63)
        elif event == "thermal":
            inj["thermal"] = True
        elif event == "power-brake":
            inj["power_brake"] = True
        elif event == "hang":
            inj["hang"] = True
        elif event == "pcie-replay":
            g["pcie_replay"] += n
        elif event in _AER:
            kind, field, sev, layer = _AER[event]
            f = dev / f"aer_dev_{kind}"
            counts = parse_aer(f.read_text())
            counts[field] = counts.get(field, 0) + n
            f.write_text(aer_text(kind, counts))
            _set_status_bits(dev / "config", kind, field)
            port = "0000:00:01.0"
            state.add_kmsg(st, f"pcieport {port}: AER: {sev.split(' ')[0]} error received: {bdf}", 3)
            state.add_kmsg(st, f"nvidia {bdf}: PCIe Bus Error: severity={sev}, type={layer}, "
                               f"(Requester ID)", 3)
            bit = (AER_COR_BIT if kind == "correctable" else AER_UNC_BIT)[field]
            state.add_kmsg(st, f"nvidia {bdf}:    [{bit:2d}] {field}", 3)
        elif event == "busy":
            g["processes"] = [p for p in g.get("processes") or [] if p["pid"] != n] + [
                {"pid": n, "used": 8 << 30}]
        elif event == "idle":
            g["processes"] = []
        elif event == "clear":
            inj.update(thermal=False, power_brake=False, hang=False)
            g["processes"] = []
        return {"event": event, "gpu": gpu, "count": n, "bdf": bdf}


def _set_status_bits(config: Any, kind: str, field: str) -> None:
    """Set the AER status bit and the Device Status error bit, touching only those dwords."""
    fd = os.open(config, os.O_RDWR)
    try:
        off = AER_CAP + (0x10 if kind == "correctable" else 0x04)
        bit = (AER_COR_BIT if kind == "correctable" else AER_UNC_BIT)[field]
        (v,) = struct.unpack("<I", os.pread(fd, 4, off))
        os.pwrite(fd, struct.pack("<I", v | (1 << bit)), off)
        (sta,) = struct.unpack("<H", os.pread(fd, 2, PCIE_CAP + 0x0A))
        flag = {"correctable": 0x1, "nonfatal": 0x2, "fatal": 0x4}[kind]
        os.pwrite(fd, struct.pack("<H", sta | flag), PCIE_CAP + 0x0A)
    finally:
        os.close(fd)
