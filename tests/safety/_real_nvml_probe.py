"""Read-only check of the health monitors against a real NVIDIA driver (run on a GPU machine:
`python3 tests/safety/_real_nvml_probe.py`). Registers for events and reads counters, the kernel
log and sysfs; changes no setting. Prints one JSON object."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import pynvml  # noqa: E402

from safety import monitors as mon  # noqa: E402


def main() -> None:
    pynvml.nvmlInit()
    out: dict = {"driver": pynvml.nvmlSystemGetDriverVersion(), "gpus": pynvml.nvmlDeviceGetCount()}
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    out["name"] = pynvml.nvmlDeviceGetName(h)
    bdf = pynvml.nvmlDeviceGetPciInfo(h).busId
    out["bdf"] = bdf.decode() if isinstance(bdf, bytes) else bdf

    def canary() -> float:
        import torch

        a = torch.ones(256, 256, device="cuda")
        return float((a @ a).sum().item())

    ms = mon.standard(pynvml, "/", canary=mon.CanaryMonitor(canary, expected=256.0 ** 3, timeout_s=30,
                                                            interval_s=0, mode="thread"))
    res = {}
    for m in ms:
        t0 = time.perf_counter()
        try:
            m.arm()
            res[m.name] = {"arm_ms": round((time.perf_counter() - t0) * 1e3, 2)}
        except Exception as e:
            res[m.name] = {"arm_error": f"{type(e).__name__}: {e}"}
    xid = next(m for m in ms if m.name == "nvml_xid")
    res["nvml_xid"]["registered"] = {str(k): hex(v) for k, v in xid.registered.items()}
    res["nvml_xid"]["supported"] = hex(pynvml.nvmlDeviceGetSupportedEventTypes(h))
    res["kmsg_xid"]["char_device"] = next(m for m in ms if m.name == "kmsg_xid").device
    res["aer"]["bdfs_with_aer"] = next(m for m in ms if m.name == "aer").bdfs()[:4]
    ecc = next(m for m in ms if m.name == "ecc")
    res["ecc"]["counters"] = {str(i): ecc._read(hh) for i, hh in ecc.handles().items()}
    th = next(m for m in ms if m.name == "thermal")
    res["thermal"]["slowdown_c"] = th._thr
    res["thermal"]["temp_c"] = pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
    ce = next(m for m in ms if m.name == "clock_events")
    res["clock_events"]["reasons"] = hex(ce._reasons(h) or 0)
    res["pcie_replay"]["counter"] = pynvml.nvmlDeviceGetPcieReplayCounter(h)
    polls, incidents = [], []
    end = time.time() + 5
    while time.time() < end:
        t0 = time.perf_counter()
        for m in ms:
            try:
                incidents += [str(i) for i in m.poll()]
            except Exception as e:
                incidents.append(f"POLL ERROR {m.name}: {type(e).__name__}: {e}")
        polls.append(time.perf_counter() - t0)
        time.sleep(0.1)
    polls.sort()
    out["monitors"] = res
    out["poll_all_ms"] = {"n": len(polls), "median": round(polls[len(polls) // 2] * 1e3, 2),
                          "max": round(polls[-1] * 1e3, 2)}
    out["canary_runs"] = ms[-1].runs
    out["incidents_in_5s"] = incidents
    end = time.time() + 30  # let a canary run in flight finish before the interpreter exits
    while ms[-1]._run is not None and time.time() < end:
        ms[-1].poll()
        time.sleep(0.05)
    for m in ms:
        m.close()
    print(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()
