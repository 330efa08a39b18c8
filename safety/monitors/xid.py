"""Xid events through NVML's event-set API (nvmlEventSetCreate, nvmlDeviceRegisterEvents,
nvmlEventSetWait_v2): critical Xids and double-bit ECC events, classified as DCGM does."""
from __future__ import annotations

from typing import Any, Iterable, Optional

from safety.incident import FATAL_XIDS, Incident, classify_xid
from safety.monitors.base import NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_TIMEOUT, NvmlMonitor, is_nvml_error, nvml_code

EVENT_XID = 0x8  # nvmlEventTypeXidCriticalError
EVENT_DBE = 0x2  # nvmlEventTypeDoubleBitEccError


def _ptr(h: Any) -> Any:
    """Device handles are ctypes pointers (compare by address); anything else by value."""
    try:
        import ctypes

        return ctypes.cast(h, ctypes.c_void_p).value
    except Exception:
        return h


class NvmlXidMonitor(NvmlMonitor):
    name = "nvml_xid"

    def __init__(self, nvml: Any, gpus: Optional[Iterable[int]] = None,
                 fatal_xids: Iterable[int] = FATAL_XIDS):
        super().__init__(nvml, gpus)
        self.fatal_xids = frozenset(fatal_xids)
        self._set: Any = None
        self.registered: dict[int, int] = {}

    def arm(self) -> None:
        if self._set is None:
            nv = self.nvml
            self._set = nv.nvmlEventSetCreate()
            want = self.const("nvmlEventTypeXidCriticalError", EVENT_XID) | \
                self.const("nvmlEventTypeDoubleBitEccError", EVENT_DBE)
            for i, h in self.handles().items():
                sup = self.query("nvmlDeviceGetSupportedEventTypes", h)
                mask = want & sup if isinstance(sup, int) else want
                if mask:
                    try:
                        nv.nvmlDeviceRegisterEvents(h, mask, self._set)
                    except Exception as e:  # e.g. vGPU: no events; the kernel log still works
                        if not (is_nvml_error(nv, e) and nvml_code(e) == NVML_ERROR_NOT_SUPPORTED):
                            raise
                        continue
                    self.registered[i] = mask
        self._drain()  # events from before the change are not its fault

    def _drain(self) -> list[Any]:
        out = []
        while True:
            try:
                out.append(self.nvml.nvmlEventSetWait_v2(self._set, 0))
            except Exception as e:
                if is_nvml_error(self.nvml, e) and nvml_code(e) == NVML_ERROR_TIMEOUT:
                    return out
                raise

    def _gpu_of(self, dev: Any) -> Optional[str]:
        key = _ptr(dev)
        for i, h in self.handles().items():
            if h is dev or _ptr(h) == key:
                return str(i)
        try:
            u = self.nvml.nvmlDeviceGetUUID(dev)
            return u.decode() if isinstance(u, bytes) else str(u)
        except Exception:
            return None

    def poll(self) -> list[Incident]:
        if self._set is None:
            return []
        out = []
        xid_t = self.const("nvmlEventTypeXidCriticalError", EVENT_XID)
        dbe_t = self.const("nvmlEventTypeDoubleBitEccError", EVENT_DBE)
        for ev in self._drain():
            gpu = self._gpu_of(getattr(ev, "device", None))
            et = int(getattr(ev, "eventType", 0))
            data = int(getattr(ev, "eventData", 0))
            if et & xid_t:
                sev = "fatal" if data in self.fatal_xids else classify_xid(data)
                out.append(self.incident("xid", sev, f"Xid {data} (NVML event)", xid=data, gpu=gpu))
            elif et & dbe_t:
                out.append(self.incident("ecc_dbe", "fatal", "double-bit ECC error (NVML event)",
                                         gpu=gpu))
        return out

    def close(self) -> None:
        if self._set is not None:
            try:
                self.nvml.nvmlEventSetFree(self._set)
            except Exception:
                pass
            self._set = None
