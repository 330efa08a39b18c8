"""BIOS attributes over Redfish, on sushy's HTTP connector (auth, retries, Redfish error parsing).

The DMTF flow, with no vendor path built by hand:
  System → Bios (current `Attributes`, `AttributeRegistry`, `@Redfish.Settings`)
  → follow `@Redfish.Settings.SettingsObject` (Dell/HPE/AMI `/Bios/Settings`, Lenovo `/Bios/Pending`)
  → GET it for its ETag and `@Redfish.SettingsApplyTime`
  → PATCH `{"Attributes": {...}, "@Redfish.SettingsApplyTime": {"ApplyTime": "OnReset"}}` with
    If-Match (some BMCs answer 428 without it, 412 when it is stale).
Changes then wait until the next system reset; the result is in the Bios resource's
`@Redfish.Settings.Messages` afterwards. metaltune never asks for ApplyTime "Immediate" (the BMC
would reboot the host on its own) and never resets the system itself.
"""
from __future__ import annotations

import logging
from typing import Any, Optional

from tuner.errors import KnobUnavailable, OperationFailed

log = logging.getLogger(__name__)


class RedfishError(OperationFailed):
    pass


def _conn_error(e: Exception) -> KnobUnavailable:
    return KnobUnavailable(f"BMC unreachable: {type(e).__name__}: {e}")


class RedfishBios:
    def __init__(self, url: str, username: Optional[str] = None, password: Optional[str] = None,
                 verify: bool | str = True, system: Optional[str] = None,
                 transport: Any = None, timeout: float = 30.0):
        from sushy import connector

        self.url = url.rstrip("/")
        base = self.url
        if transport is not None:  # an in-process BMC (sim hosts): keep the URL's scheme routed
            base = "http://sim-bmc.invalid"
        # a short connect timeout: an unreachable BMC must not stall every `metaltune host`
        self._conn = connector.Connector(base, verify=verify, server_side_retries=1,
                                         default_request_timeout=timeout,
                                         connect_timeout=min(5.0, timeout))
        if transport is not None:
            self._conn._session.mount(base, transport)
        if username is not None:
            self._conn.set_http_basic_auth(username, password or "")
        self._system = system
        self._registry: Optional[list[dict[str, Any]]] = None
        self._bios_uri: Optional[str] = None
        # GETs are cached briefly: listing a few hundred attributes would otherwise cost several
        # requests each on a slow BMC. Any write drops the cache.
        self._cache: dict[str, tuple[float, dict[str, Any], Optional[str]]] = {}
        self.cache_s = 2.0

    # -- plumbing ------------------------------------------------------------------------------
    def _get(self, path: str, fresh: bool = False) -> tuple[dict[str, Any], Optional[str]]:
        import time

        hit = self._cache.get(path)
        if hit and not fresh and time.monotonic() - hit[0] < self.cache_s:
            return hit[1], hit[2]
        doc, etag = self._get_uncached(path)
        self._cache[path] = (time.monotonic(), doc, etag)
        return doc, etag

    def invalidate(self) -> None:
        """Forget cached GETs (after something else, e.g. a reset, changed the BMC's state)."""
        self._cache.clear()

    def _get_uncached(self, path: str) -> tuple[dict[str, Any], Optional[str]]:
        from sushy import exceptions as sx

        try:
            r = self._conn.get(path)
        except sx.ConnectionError as e:
            raise _conn_error(e) from None
        except sx.HTTPError as e:
            raise RedfishError(f"GET {path}: HTTP {e.status_code}: {e.detail or e.code}") from None
        try:
            return r.json(), r.headers.get("ETag")
        except ValueError:
            raise RedfishError(f"GET {path}: not JSON") from None

    def system_uri(self) -> str:
        if self._system:
            return self._system
        coll, _ = self._get("/redfish/v1/Systems")
        members = coll.get("Members") or []
        if not members:
            raise KnobUnavailable("BMC lists no Systems")
        self._system = members[0]["@odata.id"]
        return self._system

    def bios_uri(self) -> str:
        if self._bios_uri is None:
            sysdoc, _ = self._get(self.system_uri())
            link = (sysdoc.get("Bios") or {}).get("@odata.id")
            if not link:
                raise KnobUnavailable(f"{self.system_uri()}: no Bios resource")
            self._bios_uri = link
        return self._bios_uri

    def bios(self) -> dict[str, Any]:
        return self._get(self.bios_uri())[0]

    def settings_uri(self, bios: Optional[dict[str, Any]] = None) -> str:
        bios = bios or self.bios()
        link = ((bios.get("@Redfish.Settings") or {}).get("SettingsObject") or {}).get("@odata.id")
        if not link:
            raise KnobUnavailable(f"{self.bios_uri()}: no @Redfish.Settings.SettingsObject "
                                  "(this BMC offers no way to stage BIOS changes)")
        return link

    # -- reads ---------------------------------------------------------------------------------
    def current(self) -> dict[str, Any]:
        return dict(self.bios().get("Attributes") or {})

    def pending(self) -> dict[str, Any]:
        """Attributes staged for the next reset (those that differ from the current values;
        some BMCs show the full set in the settings object)."""
        bios = self.bios()
        cur = bios.get("Attributes") or {}
        staged, _ = self._get(self.settings_uri(bios))
        return {k: v for k, v in (staged.get("Attributes") or {}).items() if cur.get(k) != v}

    def apply_times(self) -> list[str]:
        staged, _ = self._get(self.settings_uri())
        at = staged.get("@Redfish.SettingsApplyTime") or {}
        return list(at.get("ApplyTime@Redfish.AllowableValues") or [])

    def registry(self) -> list[dict[str, Any]]:
        """The attribute registry's entries (types, allowed values, bounds, read-only)."""
        if self._registry is not None:
            return self._registry
        want = self.bios().get("AttributeRegistry")
        found: list[dict[str, Any]] = []
        try:
            coll, _ = self._get("/redfish/v1/Registries")
        except RedfishError:
            coll = {}
        candidates = []
        for m in coll.get("Members") or []:
            try:
                f, _ = self._get(m["@odata.id"])
            except RedfishError:
                continue
            for loc in f.get("Location") or []:
                uri = loc.get("Uri")
                if uri and (loc.get("Language") in (None, "en")):
                    candidates.append((f.get("Id"), f.get("Registry", ""), uri))
        # exact Id first, then anything that looks like a BIOS attribute registry
        candidates.sort(key=lambda c: (c[0] != want, "Bios" not in (c[1] or "") + (c[0] or "")))
        for _, _, uri in candidates:
            try:
                doc, _ = self._get(uri)
            except RedfishError:
                continue
            attrs = (doc.get("RegistryEntries") or {}).get("Attributes")
            if attrs is None:
                continue
            if doc.get("Id") == want or not found:
                found = attrs
                if doc.get("Id") == want:
                    break
        self._registry = found
        return found

    def last_result(self) -> dict[str, Any]:
        """What the BMC reported after the last reset applied staged settings."""
        s = self.bios().get("@Redfish.Settings") or {}
        msgs = s.get("Messages") or []
        failed = []
        for m in msgs:
            sev = m.get("MessageSeverity") or m.get("Severity") or "OK"
            if sev != "OK":
                for p in m.get("RelatedProperties") or []:
                    failed.append(p.rsplit("/", 1)[-1])
        return {"time": s.get("Time"), "messages": msgs, "failed": failed}

    # -- writes --------------------------------------------------------------------------------
    def set(self, attrs: dict[str, Any]) -> None:
        """Stage attributes for the next reset (If-Match with the settings object's ETag;
        one retry after a 412, re-reading the ETag, since another client may have written)."""
        from sushy import exceptions as sx

        uri = self.settings_uri()
        self._cache.clear()
        for attempt in (1, 2):
            staged, etag = self._get(uri, fresh=True)
            body: dict[str, Any] = {"Attributes": attrs}
            allowed = (staged.get("@Redfish.SettingsApplyTime") or {}).get(
                "ApplyTime@Redfish.AllowableValues") or []
            if "OnReset" in allowed:
                body["@Redfish.SettingsApplyTime"] = {"ApplyTime": "OnReset"}
            headers = {"If-Match": etag} if etag else None
            try:
                self._conn.patch(uri, data=body, headers=headers)
                self._cache.clear()
                return
            except sx.ConnectionError as e:
                raise _conn_error(e) from None
            except sx.HTTPError as e:
                if e.status_code == 412 and attempt == 1:
                    log.info("PATCH %s: ETag %s stale, re-reading once", uri, etag)
                    continue
                if e.status_code == 428:
                    raise RedfishError(f"PATCH {uri}: the BMC requires If-Match but sent no ETag "
                                       "on GET (HTTP 428)") from None
                raise RedfishError(f"PATCH {uri}: HTTP {e.status_code}: {e.detail or e.code}") from None

    def clear(self, names: list[str]) -> None:
        """Drop staged values: stage the current value again, which BMCs treat as no change."""
        cur = self.current()
        pend = self.pending()
        todo = {n: cur[n] for n in names if n in pend and n in cur}
        if todo:
            self.set(todo)

    def close(self) -> None:
        self._conn.close()
