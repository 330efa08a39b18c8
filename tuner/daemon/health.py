"""Health readings per GPU through NVML (real or the sim's fake): what the metrics endpoint and the
idle check show. Incidents (Xid, ECC, thermal, PCIe) come from safety's monitors, not from here;
this is the dashboard half, read-only and cheap (a handful of NVML calls per GPU)."""
from __future__ import annotations

from typing import Any


ALL = ("uuid", "name", "temp_c", "power_w", "sm_clock_mhz", "mem_clock_mhz", "util_pct")


def sample(host: Any, fields: tuple[str, ...] = ALL) -> list[dict[str, Any]]:
    """One dict per GPU: index plus `fields` (uuid, name, temp_c, power_w, sm_clock_mhz,
    mem_clock_mhz, util_pct). A reading the device does not support is left out, never guessed."""
    try:
        nv = host.nvml
        n = nv.nvmlDeviceGetCount()
    except Exception:
        return []
    out = []
    for i in range(n):
        try:
            h = nv.nvmlDeviceGetHandleByIndex(i)
        except Exception:
            continue
        g: dict[str, Any] = {"index": i, "_want": fields}
        _read(g, "uuid", lambda: _str(nv.nvmlDeviceGetUUID(h)))
        _read(g, "name", lambda: _str(nv.nvmlDeviceGetName(h)))
        _read(g, "temp_c", lambda: float(nv.nvmlDeviceGetTemperature(h, getattr(nv, "NVML_TEMPERATURE_GPU", 0))))
        _read(g, "power_w", lambda: nv.nvmlDeviceGetPowerUsage(h) / 1000.0)
        _read(g, "sm_clock_mhz", lambda: float(nv.nvmlDeviceGetClockInfo(h, getattr(nv, "NVML_CLOCK_SM", 1))))
        _read(g, "mem_clock_mhz", lambda: float(nv.nvmlDeviceGetClockInfo(h, getattr(nv, "NVML_CLOCK_MEM", 2))))
        _read(g, "util_pct", lambda: float(nv.nvmlDeviceGetUtilizationRates(h).gpu))
        del g["_want"]
        out.append(g)
    return out


def _read(g: dict[str, Any], key: str, fn: Any) -> None:
    if key not in g["_want"]:
        return
    try:
        g[key] = fn()
    except Exception:
        pass


def _str(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)
