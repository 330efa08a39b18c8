"""Monitor: a small source of incidents. `arm()` takes the reference point (counters, log
position) just before a change; `poll()` returns what is new since, without blocking.

NVML monitors take an NVML-like module object (the real `pynvml`, or the simulated host's
`FakeNVML`), already initialised; filesystem monitors take the host's root folder.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Optional

from safety.incident import Incident

NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_TIMEOUT = 10


def nvml_code(e: BaseException) -> Optional[int]:
    return getattr(e, "value", None)


def is_nvml_error(nvml: Any, e: BaseException) -> bool:
    base = getattr(nvml, "NVMLError", None)
    return isinstance(e, base) if isinstance(base, type) else hasattr(e, "value")


class Monitor:
    name = "monitor"

    def arm(self) -> None:
        pass

    def poll(self) -> list[Incident]:
        return []

    def stop(self) -> None:
        """The transaction is over: end any work in flight (the monitor may be armed again)."""

    def close(self) -> None:
        pass

    def incident(self, type: str, severity: str, detail: str, **kw: Any) -> Incident:
        return Incident(type=type, severity=severity, detail=detail, source=self.name, **kw)


class NvmlMonitor(Monitor):
    """Base for monitors reading per-GPU NVML values. A query the device does not support
    disables that GPU's check instead of failing (NVMLError_NotSupported)."""

    def __init__(self, nvml: Any, gpus: Optional[Iterable[int]] = None):
        self.nvml = nvml
        self._gpus = list(gpus) if gpus is not None else None
        self._handles: Optional[dict[int, Any]] = None

    def handles(self) -> dict[int, Any]:
        if self._handles is None:
            idx = self._gpus if self._gpus is not None else range(self.nvml.nvmlDeviceGetCount())
            self._handles = {i: self.nvml.nvmlDeviceGetHandleByIndex(i) for i in idx}
        return self._handles

    def const(self, name: str, default: int) -> int:
        return int(getattr(self.nvml, name, default))

    def query(self, fn: str, *args: Any) -> Any:
        """Call an NVML function; None when the device does not support it."""
        try:
            return getattr(self.nvml, fn)(*args)
        except AttributeError:
            return None
        except Exception as e:
            if is_nvml_error(self.nvml, e) and nvml_code(e) in (NVML_ERROR_NOT_SUPPORTED, 2, 13):
                return None  # not supported / invalid argument / function not found
            raise


def read_text(p: Path) -> Optional[str]:
    try:
        return p.read_text()
    except OSError:
        return None
