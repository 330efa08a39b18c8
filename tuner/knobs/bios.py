"""`bios.<Attribute>` knobs, through the host's BMC (Redfish, or a vendor CLI; see tuner.bios).

Every BIOS change is pending until the next system reset: `apply` stages it and reads the staged
value back, `read` keeps returning the value in force, `pending` returns the staged one and
`clear_pending` (the rollback of a pending change) stages the current value again. After the
reset, `describe()` carries the BMC's result messages (a failed attribute stays at its old value).
"""
from __future__ import annotations

from typing import Any, Optional

from tuner.errors import KnobUnavailable
from tuner.knobs.base import Choice, Effect, IntRange, Knob, Unsupported, values_equal


def open_backend(host: Any) -> Optional[Any]:
    """RedfishBios or a VendorBios for this host, or None without /etc/metaltune/bmc.yaml."""
    from tuner.bios import config

    cfg = config.load(host)
    if cfg is None:
        return None
    pw = cfg.password(host)
    if cfg.method == "redfish":
        from tuner.bios.redfish import RedfishBios

        transport = None
        assert cfg.url is not None
        if cfg.url.startswith("sim-bmc://"):
            # the simulated host's BMC double, answered in-process from DIR/bmc
            from tuner.sim import bmc

            transport = bmc.adapter(host.path("/"))
        return RedfishBios(cfg.url, cfg.username, pw, verify=cfg.verify_tls, system=cfg.system,
                           transport=transport, timeout=cfg.timeout_s)
    from tuner.bios.vendor import ADAPTERS

    return ADAPTERS[cfg.method](host, cfg, pw)


def domain_of(entry: dict[str, Any]) -> Any:
    if entry.get("ReadOnly") or entry.get("Immutable"):
        return Unsupported(reason="read-only in the BIOS attribute registry")
    t = entry.get("Type")
    if t == "Enumeration":
        return Choice(values=[v["ValueName"] for v in entry.get("Value") or []])
    if t == "Integer":
        lo, hi = entry.get("LowerBound"), entry.get("UpperBound")
        if lo is None or hi is None:
            return Unsupported(reason="integer attribute without bounds in the registry")
        return IntRange(min=int(lo), max=int(hi), step=int(entry.get("ScalarIncrement") or 1))
    if t == "Boolean":
        return Choice(values=[False, True])
    return Unsupported(reason=f"{t or 'untyped'} attribute: not searched")


class BiosAttribute(Knob):
    effect = Effect.REBOOT

    def __init__(self, host: Any, backend: Any, entry: dict[str, Any], identity: str):
        super().__init__(host, f"bios.{entry['AttributeName']}")
        self.attr = entry["AttributeName"]
        self.backend = backend
        self.entry = entry
        self._identity = identity
        self.description = entry.get("HelpText") or entry.get("DisplayName") or ""

    def identity(self) -> str:
        return self._identity

    def read(self) -> Any:
        cur = self.backend.current()
        if self.attr not in cur:
            raise KnobUnavailable(f"{self.name}: the BMC does not report {self.attr}")
        return cur[self.attr]

    def limits(self) -> Any:
        return domain_of(self.entry)

    def default(self) -> Any | None:
        return self.entry.get("DefaultValue")

    def _write(self, value: Any) -> None:
        self.backend.set({self.attr: value})

    def pending(self) -> Any | None:
        return self.backend.pending().get(self.attr)

    def clear_pending(self) -> None:
        self.backend.clear([self.attr])

    def readback_matches(self, wanted: Any, got: Any) -> bool:
        # a BMC that applies at once (sushy-emulator) leaves nothing pending: the value in force
        # is then the read-back; so is staging the value already in force
        if got is None:
            return values_equal(self.read(), wanted)
        return values_equal(wanted, got)

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        try:
            d["pending"] = self.pending()
            res = self.backend.last_result()
            if res.get("time"):
                d["last_apply"] = {"time": res["time"],
                                   "failed": self.attr in res.get("failed", []),
                                   "messages": [m for m in res.get("messages", [])
                                                if any(p.endswith("/" + self.attr) for p in
                                                       m.get("RelatedProperties") or [])]}
        except Exception as e:  # describe must not fail the listing
            d["pending_error"] = str(e)
        return d


def discover(host: Any) -> list[Knob]:
    backend = open_backend(host)
    if backend is None:
        return []
    from tuner.bios import config

    cfg = config.load(host)
    want = set(cfg.attributes) if cfg and cfg.attributes else None
    ident = f"bmc:{getattr(backend, 'url', None) or cfg.method}"  # type: ignore[union-attr]
    out: list[Knob] = []
    for entry in backend.registry():
        n = entry.get("AttributeName")
        if not n or entry.get("Hidden") or (want is not None and n not in want):
            continue
        if want is None and (entry.get("ReadOnly") or entry.get("Immutable")):
            continue
        out.append(BiosAttribute(host, backend, entry, ident))
    return out
