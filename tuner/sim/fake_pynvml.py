"""A fake `pynvml` over a simulated host's state files.

`FakeNVML(root)` has the nvidia-ml-py functions the knobs, monitors and daemon call, with the same
names, parameters (tests/test_nvml_contract.py checks them against the installed module), units
(mW, MHz, °C), return kinds (ctypes handles and structs from pynvml itself, lists and tuples where
pynvml returns them) and exceptions (pynvml.NVMLError(code), which yields the same subclasses,
e.g. NVMLError_NotSupported). Where nvidia-ml-py ignores the C return code
(nvmlDeviceSetPowerManagementLimit_v2, nvmlDeviceGet/SetClockOffsets) the fake fails silently too,
so only a read-back tells a write from a no-op, as on real hardware.

Sensors (clock, power, temperature, utilisation, clock event reasons) are those of the workload while
one runs; when idle the clock falls to the lock floor (or the minimum), power to idle, utilisation to
0, and temperature and slowdown reasons stay those of the last run (the sim has no clock to cool by).
"""
from __future__ import annotations

import ctypes
import os
import time
from typing import Any

import pynvml

from tuner.pids import alive
from tuner.sim import model
from tuner.sim.nvml_clocks import ClocksMixin, nvml_error
from tuner.sim.nvml_energy import EnergyMixin  # power usage, total energy
from tuner.sim.skus import Sku, get_sku
from tuner.sim.state import SimState

_HANDLE_BASE = 0x6E766D6C0000  # arbitrary non-null "pointer" values
_EVENTSET_BASE = 0x6576656E0000
_STICKY_REASONS = (model.SW_POWER_CAP | model.HW_SLOWDOWN | model.HW_THERMAL
                   | model.HW_POWER_BRAKE)


def _norm_busid(s: Any) -> str:
    s = s.decode() if isinstance(s, bytes) else str(s)
    s = s.strip().lower()
    parts = s.split(":")
    if len(parts) == 2:
        parts = ["0", *parts]
    if len(parts) != 3:
        return s
    return f"{int(parts[0], 16):08x}:{parts[1]}:{parts[2]}"


class FakeNVML(ClocksMixin, EnergyMixin):
    # the constants and classes callers reach through the module (pynvml.NVML_CLOCK_GRAPHICS, ...)
    def __getattr__(self, name: str) -> Any:
        if name.startswith("nvml") and callable(getattr(pynvml, name, None)):
            raise AttributeError(f"FakeNVML does not implement {name}")
        try:
            return getattr(pynvml, name)
        except AttributeError:
            raise AttributeError(name) from None

    def __init__(self, root: str | os.PathLike[str]):
        self._root = os.fspath(root)
        self._state = SimState(root)
        self._refcount = 0
        self._eventsets: dict[int, dict[str, Any]] = {}
        self._next_set = 1

    # -- plumbing -----------------------------------------------------------------------------
    def _read(self) -> dict[str, Any]:
        if self._refcount <= 0:
            raise nvml_error(pynvml.NVML_ERROR_UNINITIALIZED)
        return self._state.read()

    def _sku(self, st: dict[str, Any]) -> Sku:
        return get_sku(st["sku"])

    def _index(self, handle: Any, st: dict[str, Any]) -> int:
        if not isinstance(handle, pynvml.c_nvmlDevice_t):
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        addr = ctypes.cast(handle, ctypes.c_void_p).value or 0
        i = addr - _HANDLE_BASE
        if not 0 <= i < len(st["gpus"]):
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return i

    def _gpu(self, handle: Any) -> tuple[dict[str, Any], dict[str, Any], Sku]:
        st = self._read()
        return st["gpus"][self._index(handle, st)], st, self._sku(st)

    @staticmethod
    def _handle(index: int) -> Any:
        return ctypes.cast(ctypes.c_void_p(_HANDLE_BASE + index), pynvml.c_nvmlDevice_t)

    def _write(self, handle: Any, fn: Any) -> None:
        """Run fn(gpu, sku) under the state lock. Setters answer NoPermission on a VM host."""
        st0 = self._read()
        i = self._index(handle, st0)
        if st0.get("vm"):
            raise nvml_error(pynvml.NVML_ERROR_NO_PERMISSION)
        with self._state.edit() as st:
            fn(st["gpus"][i], self._sku(st))

    @staticmethod
    def _busy(g: dict[str, Any]) -> bool:
        b = g.get("busy")
        return bool(b) and alive(int(b.get("pid", 0)))

    # -- init / system ------------------------------------------------------------------------
    def nvmlInitWithFlags(self, flags: int) -> None:
        if not os.path.isfile(self._state.file):
            raise nvml_error(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
        self._refcount += 1
        return None

    def nvmlInit(self) -> None:
        self.nvmlInitWithFlags(0)
        return None

    def nvmlShutdown(self) -> None:
        if self._refcount <= 0:
            raise nvml_error(pynvml.NVML_ERROR_UNINITIALIZED)
        self._refcount -= 1
        return None

    def nvmlSystemGetDriverVersion(self) -> str:
        return self._read()["driver"]

    def nvmlSystemGetNVMLVersion(self) -> str:
        return self._read()["nvml_version"]

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return int(self._read().get("cuda_driver", 13000))

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        return self.nvmlSystemGetCudaDriverVersion()

    def nvmlDeviceGetCount(self) -> int:
        return len(self._read()["gpus"])

    # -- identity -----------------------------------------------------------------------------
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        st = self._read()
        if not isinstance(index, int) or not 0 <= index < len(st["gpus"]):
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._handle(index)

    def nvmlDeviceGetHandleByUUID(self, uuid: Any) -> Any:
        st = self._read()
        u = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
        for g in st["gpus"]:
            if g["uuid"].lower() == u.lower():
                return self._handle(g["index"])
        raise nvml_error(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetHandleByPciBusId(self, pciBusId: Any) -> Any:
        st = self._read()
        want = _norm_busid(pciBusId)
        for g in st["gpus"]:
            if _norm_busid(g["bdf"]) == want:
                return self._handle(g["index"])
        raise nvml_error(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return self._gpu(handle)[2].marketing_name

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return self._gpu(handle)[0]["uuid"]

    def nvmlDeviceGetSerial(self, handle: Any) -> str:
        g, _, sku = self._gpu(handle)
        if not sku.ecc:  # GeForce boards report no serial
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return g["serial"]

    def nvmlDeviceGetIndex(self, handle: Any) -> int:
        return self._gpu(handle)[0]["index"]

    def nvmlDeviceGetPciInfo_v3(self, handle: Any) -> Any:
        g, _, sku = self._gpu(handle)
        dom, bus, devfn = g["bdf"].split(":")
        dev = devfn.split(".")[0]
        info = pynvml.nvmlPciInfo_t()
        info.busIdLegacy = f"{int(dom, 16):04x}:{bus}:{devfn}".upper().encode()
        info.domain = int(dom, 16)
        info.bus = int(bus, 16)
        info.device = int(dev, 16)
        info.pciDeviceId = (sku.pci_device_id << 16) | 0x10DE
        info.pciSubSystemId = (sku.pci_subsys << 16) | 0x10DE
        info.busId = f"{int(dom, 16):08x}:{bus}:{devfn}".upper().encode()
        return info

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        return self.nvmlDeviceGetPciInfo_v3(handle)

    def nvmlDeviceGetCudaComputeCapability(self, handle: Any) -> tuple[int, int]:
        return (9, 0) if self._gpu(handle)[2].name == "h200" else (8, 9)

    def nvmlDeviceGetVirtualizationMode(self, handle: Any) -> int:
        _, st, _ = self._gpu(handle)
        return (pynvml.NVML_GPU_VIRTUALIZATION_MODE_PASSTHROUGH if st.get("vm")
                else pynvml.NVML_GPU_VIRTUALIZATION_MODE_NONE)

    def nvmlDeviceGetMigMode(self, device: Any) -> list[int]:
        if not self._gpu(device)[2].nvlink:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return [0, 0]

    def nvmlDeviceGetComputeMode(self, handle: Any) -> int:
        self._gpu(handle)
        return pynvml.NVML_COMPUTEMODE_DEFAULT

    def nvmlDeviceGetPerformanceState(self, handle: Any) -> int:
        self._gpu(handle)
        return pynvml.NVML_PSTATE_0

    def nvmlDeviceGetAPIRestriction(self, device: Any, apiType: int) -> int:
        self._gpu(device)
        raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)  # as read on the H200

    # -- power --------------------------------------------------------------------------------
    def nvmlDeviceGetPowerManagementLimit(self, handle: Any) -> int:
        return int(self._gpu(handle)[0]["power_limit_mw"])

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int:
        return int(self._gpu(handle)[0]["power_limit_mw"])

    def nvmlDeviceGetPowerManagementLimitConstraints(self, handle: Any) -> list[int]:
        sku = self._gpu(handle)[2]
        return [sku.power_min_w * 1000, sku.power_max_w * 1000]

    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle: Any) -> int:
        return self._gpu(handle)[2].power_default_w * 1000

    def _set_power(self, handle: Any, limit: Any) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int):
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)

        def f(g: dict[str, Any], sku: Sku) -> None:
            if not sku.power_min_w * 1000 <= limit <= sku.power_max_w * 1000:
                raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            g["power_limit_mw"] = int(limit)

        self._write(handle, f)

    def nvmlDeviceSetPowerManagementLimit(self, handle: Any, limit: int) -> None:
        self._set_power(handle, limit)
        return None

    def nvmlDeviceSetPowerManagementLimit_v2(self, device: Any, powerScope: int, powerLimit: int,
                                             version: int = pynvml.nvmlPowerValue_v2) -> int:
        # nvidia-ml-py does not check this call's return code: failures are silent
        try:
            if version != pynvml.nvmlPowerValue_v2 or powerScope != pynvml.NVML_POWER_SCOPE_GPU:
                raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
            self._set_power(device, powerLimit)
        except pynvml.NVMLError:
            pass
        return pynvml.NVML_SUCCESS

    # -- persistence --------------------------------------------------------------------------
    def nvmlDeviceGetPersistenceMode(self, handle: Any) -> int:
        return int(self._gpu(handle)[0]["persistence"])

    def nvmlDeviceSetPersistenceMode(self, handle: Any, mode: int) -> None:
        if mode not in (pynvml.NVML_FEATURE_DISABLED, pynvml.NVML_FEATURE_ENABLED):
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self._write(handle, lambda g, sku: g.update(persistence=int(mode)))
        return None

    # -- thermals and throttling --------------------------------------------------------------
    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        g, _, sku = self._gpu(handle)
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        t = float(g["last_run"]["temp_c"]) if g.get("last_run") else float(sku.idle_temp)
        if (g.get("injected") or {}).get("thermal"):
            t = max(t, sku.temp_slowdown + 3)
        return int(round(t))

    def nvmlDeviceGetTemperatureThreshold(self, handle: Any, threshold: int) -> int:
        sku = self._gpu(handle)[2]
        table = {pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: sku.temp_shutdown,
                 pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: sku.temp_slowdown,
                 pynvml.NVML_TEMPERATURE_THRESHOLD_MEM_MAX: sku.temp_mem_max,
                 pynvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX: sku.temp_gpu_max}
        if threshold not in table:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return table[threshold]

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        g, _, _ = self._gpu(handle)
        last = int(g["last_run"]["reasons"]) if g.get("last_run") else 0
        r = last if self._busy(g) else (model.GPU_IDLE | (last & _STICKY_REASONS))
        inj = g.get("injected") or {}
        if inj.get("thermal"):
            r |= model.HW_SLOWDOWN | model.HW_THERMAL
        if inj.get("power_brake"):
            r |= model.HW_SLOWDOWN | model.HW_POWER_BRAKE
        return r

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any) -> int:
        return self.nvmlDeviceGetCurrentClocksEventReasons(handle)

    def nvmlDeviceGetSupportedClocksEventReasons(self, handle: Any) -> int:
        self._gpu(handle)
        return pynvml.nvmlClocksEventReasonAll

    def nvmlDeviceGetSupportedClocksThrottleReasons(self, handle: Any) -> int:
        return self.nvmlDeviceGetSupportedClocksEventReasons(handle)

    # -- memory errors ------------------------------------------------------------------------
    def nvmlDeviceGetEccMode(self, handle: Any) -> list[int]:
        g = self._gpu(handle)[0]
        return [int(g["ecc_mode"]), int(g["ecc_mode"])]

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, errorType: int, counterType: int) -> int:
        g = self._gpu(handle)[0]
        if not g["ecc_mode"]:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        kind = {pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED: "corrected",
                pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED: "uncorrected"}.get(errorType)
        counter = {pynvml.NVML_VOLATILE_ECC: "volatile",
                   pynvml.NVML_AGGREGATE_ECC: "aggregate"}.get(counterType)
        if kind is None or counter is None:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return int(g["ecc"][counter][kind])

    def nvmlDeviceGetRemappedRows(self, device: Any) -> tuple[int, int, int, int]:
        g, _, sku = self._gpu(device)
        if sku.name != "h200":  # row remapping is an HBM data-centre feature (A100 and later)
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        r = g["remapped"]
        return (r["correctable"], r["uncorrectable"], r["pending"], r["failure"])

    def nvmlDeviceGetRetiredPages(self, device: Any, sourceFilter: int) -> list[int]:
        g, _, sku = self._gpu(device)
        if sku.name == "h200":  # replaced by row remapping
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        key = {pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS: "sbe",
               pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR: "dbe"}.get(sourceFilter)
        if key is None:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return [int(p) for p in g["retired_pages"][key]]

    # -- PCIe ---------------------------------------------------------------------------------
    def nvmlDeviceGetPcieReplayCounter(self, handle: Any) -> int:
        return int(self._gpu(handle)[0]["pcie_replay"])

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: Any) -> int:
        return self._gpu(handle)[2].pcie_gen

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: Any) -> int:
        return self._gpu(handle)[2].pcie_gen

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: Any) -> int:
        return self._gpu(handle)[2].pcie_width

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: Any) -> int:
        return self._gpu(handle)[2].pcie_width

    # -- memory, utilisation, processes -------------------------------------------------------
    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: Any = None) -> Any:
        g, _, sku = self._gpu(handle)
        used = (sku.memory_total * 9 // 10) if self._busy(g) else 570 << 20
        if version:
            m = pynvml.c_nvmlMemory_v2_t()
            m.version = version
            m.reserved = 512 << 20
        else:
            m = pynvml.c_nvmlMemory_t()
        m.total, m.used, m.free = sku.memory_total, used, sku.memory_total - used
        return m

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        g = self._gpu(handle)[0]
        u = pynvml.c_nvmlUtilization_t()
        tenant = any(alive(int(p["pid"])) for p in g.get("processes") or [])
        u.gpu, u.memory = (100, 72) if self._busy(g) or tenant else (0, 0)
        return u

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        g = self._gpu(handle)[0]
        procs = []
        entries = list(g.get("processes") or [])
        if self._busy(g):
            entries.append({"pid": int(g["busy"]["pid"]), "used": 0})
        for e in entries:
            if not alive(int(e["pid"])):
                continue
            c = pynvml.c_nvmlProcessInfo_v3_t()
            c.pid = int(e["pid"])
            c.usedGpuMemory = int(e.get("used", 0)) or (1 << 30)
            c.gpuInstanceId = c.computeInstanceId = 0xFFFFFFFF
            procs.append(pynvml.nvmlStructToFriendlyObject(c))
        return procs

    # -- events -------------------------------------------------------------------------------
    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:
        return self._gpu(handle)[2].supported_events

    def nvmlEventSetCreate(self) -> Any:
        st = self._read()
        sid = self._next_set
        self._next_set += 1
        self._eventsets[sid] = {"devices": {}, "cursor": int(st.get("event_seq", 0))}
        return ctypes.cast(ctypes.c_void_p(_EVENTSET_BASE + sid), pynvml.c_nvmlEventSet_t)

    def _eventset(self, eventSet: Any) -> dict[str, Any]:
        if not isinstance(eventSet, pynvml.c_nvmlEventSet_t):
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        sid = (ctypes.cast(eventSet, ctypes.c_void_p).value or 0) - _EVENTSET_BASE
        if sid not in self._eventsets:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._eventsets[sid]

    def nvmlDeviceRegisterEvents(self, handle: Any, eventTypes: int, eventSet: Any) -> None:
        g, st, sku = self._gpu(handle)
        es = self._eventset(eventSet)
        if eventTypes & ~sku.supported_events:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if not es["devices"]:  # events from registration on are delivered
            es["cursor"] = int(st.get("event_seq", 0))
        es["devices"][g["index"]] = es["devices"].get(g["index"], 0) | int(eventTypes)
        return None

    def nvmlEventSetWait_v2(self, eventSet: Any, timeoutms: int) -> Any:
        es = self._eventset(eventSet)
        self._read()
        deadline = time.monotonic() + max(int(timeoutms), 0) / 1000.0
        while True:
            for ev in self._state.read_events(es["cursor"]):
                es["cursor"] = ev["seq"]
                mask = es["devices"].get(ev["gpu"], 0)
                if mask & int(ev["type"]):
                    d = pynvml.c_nvmlEventData_t()
                    d.device = self._handle(int(ev["gpu"]))
                    d.eventType = int(ev["type"])
                    d.eventData = int(ev["data"])
                    d.gpuInstanceId = d.computeInstanceId = 0xFFFFFFFF
                    return d
            left = deadline - time.monotonic()
            if left <= 0:
                raise nvml_error(pynvml.NVML_ERROR_TIMEOUT)
            time.sleep(min(0.01, left))

    def nvmlEventSetWait(self, eventSet: Any, timeoutms: int) -> Any:
        return self.nvmlEventSetWait_v2(eventSet, timeoutms)

    def nvmlEventSetFree(self, eventSet: Any) -> None:
        self._eventset(eventSet)
        sid = (ctypes.cast(eventSet, ctypes.c_void_p).value or 0) - _EVENTSET_BASE
        del self._eventsets[sid]
        return None
