"""The fake NVML's clocks: supported and current clocks, locked GPU and memory clocks,
application clocks, and clock offsets (the VF-offset calls and nvmlDeviceGet/SetClockOffsets),
as a mixin of `tuner.sim.fake_pynvml.FakeNVML` (whose `_gpu`, `_write` and `_busy` it uses).
The same behaviour the module docstring there describes: where nvidia-ml-py ignores the C
return code (the offset setters), the fake fails silently too."""
from __future__ import annotations

import ctypes
from typing import Any

import pynvml

from tuner.sim.skus import Sku


def nvml_error(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


class ClocksMixin:
    _gpu: Any
    _write: Any
    _busy: Any

    # -- clocks -------------------------------------------------------------------------------
    def nvmlDeviceGetSupportedMemoryClocks(self, handle: Any) -> list[int]:
        return list(self._gpu(handle)[2].mem_clocks)

    def nvmlDeviceGetSupportedGraphicsClocks(self, handle: Any, memoryClockMHz: int) -> list[int]:
        sku = self._gpu(handle)[2]
        if memoryClockMHz not in sku.mem_clocks:
            raise nvml_error(pynvml.NVML_ERROR_NOT_FOUND)
        return sku.graphics_clocks()

    def _current_clock(self, g: dict[str, Any], sku: Sku, type: int) -> int:
        if type in (pynvml.NVML_CLOCK_GRAPHICS, pynvml.NVML_CLOCK_SM):
            if self._busy(g) and g.get("last_run"):
                return int(g["last_run"]["clock_mhz"])
            lock = g.get("locked_gr")
            return int(lock[0]) if lock else sku.gr_min
        if type == pynvml.NVML_CLOCK_MEM:
            if self._busy(g) and g.get("last_run"):
                return int(g["last_run"]["mem_clock_mhz"])
            lock = g.get("locked_mem")
            base = int(lock[0]) if lock else int(g.get("app_mem") or sku.mem_top)
            return base + int(g.get("mem_offset", 0))
        if type == pynvml.NVML_CLOCK_VIDEO:
            return sku.video_clock
        raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlDeviceGetClockInfo(self, handle: Any, type: int) -> int:
        g, _, sku = self._gpu(handle)
        return self._current_clock(g, sku, type)

    def nvmlDeviceGetMaxClockInfo(self, handle: Any, type: int) -> int:
        sku = self._gpu(handle)[2]
        if type in (pynvml.NVML_CLOCK_GRAPHICS, pynvml.NVML_CLOCK_SM):
            return sku.gr_max
        if type == pynvml.NVML_CLOCK_MEM:
            return sku.mem_top
        if type == pynvml.NVML_CLOCK_VIDEO:
            return sku.video_clock
        raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlDeviceGetMaxCustomerBoostClock(self, handle: Any, type: int) -> int:
        sku = self._gpu(handle)[2]
        if type in (pynvml.NVML_CLOCK_GRAPHICS, pynvml.NVML_CLOCK_SM):
            return sku.gr_max
        raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetClock(self, handle: Any, type: int, id: int) -> int:
        g, _, sku = self._gpu(handle)
        if id == pynvml.NVML_CLOCK_ID_CURRENT:
            return self._current_clock(g, sku, type)
        if id == pynvml.NVML_CLOCK_ID_APP_CLOCK_TARGET:
            return self.nvmlDeviceGetApplicationsClock(handle, type)
        if id == pynvml.NVML_CLOCK_ID_APP_CLOCK_DEFAULT:
            return self.nvmlDeviceGetDefaultApplicationsClock(handle, type)
        if id == pynvml.NVML_CLOCK_ID_CUSTOMER_BOOST_MAX:
            return self.nvmlDeviceGetMaxCustomerBoostClock(handle, type)
        raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlDeviceSetGpuLockedClocks(self, handle: Any, minGpuClockMHz: int,
                                     maxGpuClockMHz: int) -> None:
        def f(g: dict[str, Any], sku: Sku) -> None:
            lo, hi = int(minGpuClockMHz), int(maxGpuClockMHz)
            if lo > hi or lo < sku.gr_min or hi > sku.gr_max:
                raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            # the driver rounds to its 15 MHz clock bins
            snap = lambda c: sku.gr_min + round((c - sku.gr_min) / sku.gr_step) * sku.gr_step  # noqa: E731
            g["locked_gr"] = [snap(lo), snap(hi)]

        self._write(handle, f)
        return None

    def nvmlDeviceResetGpuLockedClocks(self, handle: Any) -> None:
        self._write(handle, lambda g, sku: g.update(locked_gr=None))
        return None

    def nvmlDeviceSetMemoryLockedClocks(self, handle: Any, minMemClockMHz: int,
                                        maxMemClockMHz: int) -> None:
        def f(g: dict[str, Any], sku: Sku) -> None:
            lo, hi = int(minMemClockMHz), int(maxMemClockMHz)
            if lo > hi or lo < min(sku.mem_clocks) or hi > sku.mem_top:
                raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            near = lambda c: min(sku.mem_clocks, key=lambda m: abs(m - c))  # noqa: E731
            g["locked_mem"] = [near(lo), near(hi)]

        self._write(handle, f)
        return None

    def nvmlDeviceResetMemoryLockedClocks(self, handle: Any) -> None:
        self._write(handle, lambda g, sku: g.update(locked_mem=None))
        return None

    def nvmlDeviceGetApplicationsClock(self, handle: Any, type: int) -> int:
        g, _, sku = self._gpu(handle)
        if not sku.app_clocks:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if type in (pynvml.NVML_CLOCK_GRAPHICS, pynvml.NVML_CLOCK_SM):
            return int(g.get("app_gr") or sku.gr_max)
        if type == pynvml.NVML_CLOCK_MEM:
            return int(g.get("app_mem") or sku.mem_top)
        raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlDeviceGetDefaultApplicationsClock(self, handle: Any, type: int) -> int:
        sku = self._gpu(handle)[2]
        if not sku.app_clocks:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if type in (pynvml.NVML_CLOCK_GRAPHICS, pynvml.NVML_CLOCK_SM):
            return sku.gr_max
        if type == pynvml.NVML_CLOCK_MEM:
            return sku.mem_top
        raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlDeviceSetApplicationsClocks(self, handle: Any, maxMemClockMHz: int,
                                        maxGraphicsClockMHz: int) -> None:
        def f(g: dict[str, Any], sku: Sku) -> None:
            if not sku.app_clocks:
                raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
            if maxMemClockMHz not in sku.mem_clocks or (
                    maxGraphicsClockMHz not in sku.graphics_clocks()):
                raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            g["app_mem"], g["app_gr"] = int(maxMemClockMHz), int(maxGraphicsClockMHz)

        self._write(handle, f)
        return None

    def nvmlDeviceResetApplicationsClocks(self, handle: Any) -> None:
        def f(g: dict[str, Any], sku: Sku) -> None:
            if not sku.app_clocks:
                raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
            g["app_mem"] = g["app_gr"] = None

        self._write(handle, f)
        return None

    # -- clock offsets ------------------------------------------------------------------------
    def _offset_range(self, sku: Sku, kind: str) -> tuple[int, int]:
        return sku.gpc_offset_range if kind == "gpc" else sku.mem_offset_range

    def _set_offset(self, handle: Any, kind: str, offset: int) -> None:
        def f(g: dict[str, Any], sku: Sku) -> None:
            lo, hi = self._offset_range(sku, kind)
            if (lo, hi) == (0, 0):
                raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
            if not lo <= int(offset) <= hi:
                raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            g["gpc_offset" if kind == "gpc" else "mem_offset"] = int(offset)

        self._write(handle, f)

    def nvmlDeviceGetGpcClkVfOffset(self, device: Any) -> int:
        return int(self._gpu(device)[0].get("gpc_offset", 0))

    def nvmlDeviceGetMemClkVfOffset(self, device: Any) -> int:
        return int(self._gpu(device)[0].get("mem_offset", 0))

    def _minmax(self, device: Any, kind: str, minOffset: Any, maxOffset: Any) -> Any:
        lo, hi = self._offset_range(self._gpu(device)[2], kind)
        if type(minOffset) is not ctypes.c_int or type(maxOffset) is not ctypes.c_int:
            for ref, v in ((minOffset, lo), (maxOffset, hi)):  # byref()/pointer() outputs
                obj = getattr(ref, "_obj", None)  # byref(); a c_int(0) is falsy, so test None
                if obj is None:
                    obj = getattr(ref, "contents", None)  # pointer()
                if obj is not None:
                    obj.value = v
            return pynvml.NVML_SUCCESS
        return (lo, hi)

    def nvmlDeviceGetGpcClkMinMaxVfOffset(self, device: Any, minOffset: Any = ctypes.c_int(0),
                                          maxOffset: Any = ctypes.c_int(0)) -> Any:
        return self._minmax(device, "gpc", minOffset, maxOffset)

    def nvmlDeviceGetMemClkMinMaxVfOffset(self, device: Any, minOffset: Any = ctypes.c_int(0),
                                          maxOffset: Any = ctypes.c_int(0)) -> Any:
        return self._minmax(device, "mem", minOffset, maxOffset)

    def nvmlDeviceSetGpcClkVfOffset(self, device: Any, offset: int) -> int:
        self._set_offset(device, "gpc", offset)
        return pynvml.NVML_SUCCESS

    def nvmlDeviceSetMemClkVfOffset(self, device: Any, offset: int) -> int:
        self._set_offset(device, "mem", offset)
        return pynvml.NVML_SUCCESS

    @staticmethod
    def _struct(info: Any) -> Any:
        """The c_nvmlClockOffset_t behind info, byref(info) or pointer(info)."""
        if isinstance(info, pynvml.c_nvmlClockOffset_t):
            return info
        obj = getattr(info, "_obj", None)
        if isinstance(obj, pynvml.c_nvmlClockOffset_t):
            return obj
        contents = getattr(info, "contents", None)
        if isinstance(contents, pynvml.c_nvmlClockOffset_t):
            return contents
        return None

    def _offset_kind(self, s: Any) -> str | None:
        if s is None or s.version != pynvml.nvmlClockOffset_v1 or s.pstate != pynvml.NVML_PSTATE_0:
            return None
        if s.type in (pynvml.NVML_CLOCK_GRAPHICS, pynvml.NVML_CLOCK_SM):
            return "gpc"
        if s.type == pynvml.NVML_CLOCK_MEM:
            return "mem"
        return None

    def nvmlDeviceGetClockOffsets(self, device: Any, info: Any) -> int:
        # nvidia-ml-py ignores this call's return code: on failure `info` is simply left as it was
        try:
            g, _, sku = self._gpu(device)
        except pynvml.NVMLError:
            return pynvml.NVML_SUCCESS
        s = self._struct(info)
        kind = self._offset_kind(s)
        if kind is None:
            return pynvml.NVML_SUCCESS
        lo, hi = self._offset_range(sku, kind)
        s.clockOffsetMHz = int(g.get("gpc_offset" if kind == "gpc" else "mem_offset", 0))
        s.minClockOffsetMHz, s.maxClockOffsetMHz = lo, hi
        return pynvml.NVML_SUCCESS

    def nvmlDeviceSetClockOffsets(self, device: Any, info: Any) -> int:
        kind = self._offset_kind(self._struct(info))
        try:
            if kind is None:
                raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            self._set_offset(device, kind, int(self._struct(info).clockOffsetMHz))
        except pynvml.NVMLError:
            pass  # silent, as in nvidia-ml-py
        return pynvml.NVML_SUCCESS
