"""ECC: volatile corrected / uncorrected counters (nvmlDeviceGetTotalEccErrors) and row
remapping (nvmlDeviceGetRemappedRows, Ampere and later: H100/H200 remap rows instead of
retiring pages). Uncorrected errors and remap failures are fatal; corrected ones a warning."""
from __future__ import annotations

from typing import Any, Iterable, Optional

from safety.incident import Incident
from safety.monitors.base import NvmlMonitor

CORRECTED, UNCORRECTED, VOLATILE = 0, 1, 0


class EccMonitor(NvmlMonitor):
    name = "ecc"

    def __init__(self, nvml: Any, gpus: Optional[Iterable[int]] = None):
        super().__init__(nvml, gpus)
        self._ref: dict[int, dict[str, Any]] = {}

    def _read(self, h: Any) -> dict[str, Any]:
        unc_t = self.const("NVML_MEMORY_ERROR_TYPE_UNCORRECTED", UNCORRECTED)
        cor_t = self.const("NVML_MEMORY_ERROR_TYPE_CORRECTED", CORRECTED)
        vol = self.const("NVML_VOLATILE_ECC", VOLATILE)
        rr = self.query("nvmlDeviceGetRemappedRows", h)
        return {
            "unc": self.query("nvmlDeviceGetTotalEccErrors", h, unc_t, vol),
            "cor": self.query("nvmlDeviceGetTotalEccErrors", h, cor_t, vol),
            "rows": tuple(rr) if rr is not None else None,  # (corr, unc, pending, failure)
        }

    def arm(self) -> None:
        self._ref = {i: self._read(h) for i, h in self.handles().items()}

    def poll(self) -> list[Incident]:
        out = []
        for i, h in self.handles().items():
            now, ref = self._read(h), self._ref.get(i) or {}
            gpu = str(i)
            if now["unc"] is not None and ref.get("unc") is not None and now["unc"] > ref["unc"]:
                out.append(self.incident("ecc_dbe", "fatal", f"{now['unc'] - ref['unc']} new"
                                         f" uncorrected (double-bit) ECC errors", gpu=gpu,
                                         data={"volatile_uncorrected": now["unc"]}))
            if now["cor"] is not None and ref.get("cor") is not None and now["cor"] > ref["cor"]:
                out.append(self.incident("ecc_sbe", "warning", f"{now['cor'] - ref['cor']} new"
                                         f" corrected ECC errors", gpu=gpu,
                                         data={"volatile_corrected": now["cor"]}))
            if now["rows"] is not None and ref.get("rows") is not None:
                c, u, pend, fail = now["rows"]
                c0, u0, pend0, fail0 = ref["rows"]
                if fail and not fail0:
                    out.append(self.incident("remapped_rows", "fatal", "row remapping failed",
                                             gpu=gpu))
                elif u > u0:
                    out.append(self.incident("remapped_rows", "fatal", f"{u - u0} rows remapped"
                                             f" for uncorrectable errors", gpu=gpu))
                elif pend and not pend0:
                    out.append(self.incident("remapped_rows", "warning", "row remap pending (needs"
                                             " a GPU reset)", gpu=gpu))
            self._ref[i] = now
        return out
