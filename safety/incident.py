"""Incident: one instability signal from a health monitor, plus DCGM's Xid classification."""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Optional

Severity = Literal["fatal", "warning", "info"]

# DCGM health-watch classification (dcgm_errors.h / the Xid catalogue):
#  48 DBE, 74 NVLink, 79 fallen off the bus, 95 uncontained ECC, 119/120 GSP RPC timeout / error,
#  140 unrecovered ECC: the GPU state cannot be trusted -> roll back at once.
FATAL_XIDS = frozenset({48, 74, 79, 95, 119, 120, 140})
#  94: contained ECC error, the application was killed but the GPU is fine.
WARNING_XIDS = frozenset({94})
#  13 graphics engine exception, 31 MMU fault, 43 GPU stopped processing: usually the application.
APPLICATION_XIDS = frozenset({13, 31, 43})


def classify_xid(xid: int) -> Severity:
    if xid in FATAL_XIDS:
        return "fatal"
    if xid in APPLICATION_XIDS:
        return "info"
    return "warning"  # 94 and Xids DCGM does not single out: recorded, not rolled back


# incident type -> the trial reason code (tuner.trial.REASONS) a rollback for it carries
REASON_BY_TYPE = {
    "xid": "instability_xid",
    "ecc_dbe": "instability_ecc",
    "ecc_sbe": "instability_ecc",
    "remapped_rows": "instability_ecc",
    "pcie_replay": "instability_pcie",
    "aer": "instability_pcie",
    "clock_event": "instability_thermal",
    "thermal": "instability_thermal",
    "canary_hang": "instability_hang",
    "canary_failed": "canary_failed",
    "canary_kernel": "canary_failed",  # an installed kernel computed wrong in use (its canary)
    "hang": "instability_hang",
}


@dataclass
class Incident:
    type: str  # xid, ecc_dbe, ecc_sbe, remapped_rows, pcie_replay, aer, clock_event, thermal, canary_*
    severity: Severity
    detail: str
    source: str = ""  # which monitor saw it
    xid: Optional[int] = None
    gpu: Optional[str] = None  # GPU index, UUID or PCI BDF
    time: float = field(default_factory=time.time)
    data: dict[str, Any] = field(default_factory=dict)
    # filled in by the transaction / journal: the change active when it happened
    txn_id: Optional[int] = None
    knob: Optional[str] = None
    id: Optional[int] = None

    @property
    def fatal(self) -> bool:
        return self.severity == "fatal"

    @property
    def reason(self) -> str:
        return REASON_BY_TYPE.get(self.type, "instability_" + self.type)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["reason"] = self.reason
        return d

    def __str__(self) -> str:
        where = f" gpu {self.gpu}" if self.gpu is not None else ""
        return f"{self.severity} {self.type}{where}: {self.detail}"
