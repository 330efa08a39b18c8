"""A small Redfish BMC double for BIOS settings, with the behaviour real BMCs have and
sushy-emulator lacks: changes wait in the settings object until a system reset, writes need
If-Match (428 without, 412 on a stale ETag), and the result of applying them is reported after the
reset in `@Redfish.Settings.Messages` (a failed attribute stays at its old value).

State lives in files under DIR/bmc/ (state.json, registry.json), so it survives any process, as the
rest of a simulated host does. `BmcDouble.handle()` answers one request; it is served over HTTP on
127.0.0.1 by `serve()` (tests) or called in-process through `Adapter` (a requests transport used for
`sim-bmc://` URLs, so a sim host's BIOS knobs talk Redfish without a listening socket).
"""
from __future__ import annotations

import base64
import copy
import fcntl
import http.server
import io
import json
import os
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

SYS = "/redfish/v1/Systems/1"
BIOS = f"{SYS}/Bios"
SETTINGS = f"{BIOS}/Settings"
REGISTRY_ID = "BiosAttributeRegistryMetaltune.v1_0_0"
REGISTRY_FILE = f"/redfish/v1/Registries/{REGISTRY_ID}"
REGISTRY_DOC = f"{REGISTRY_FILE}/{REGISTRY_ID}.json"
APPLY_TIMES = ["OnReset", "AtMaintenanceWindowStart"]

# Attributes of a typical GPU server BIOS (names as Dell/HPE/AMI registries spell them).
DEFAULT_REGISTRY: list[dict[str, Any]] = [
    {"AttributeName": "WorkloadProfile", "Type": "Enumeration", "ReadOnly": False,
     "Value": [{"ValueName": v} for v in
               ["Balanced", "HighPerformanceCompute", "LowLatency", "PowerEfficient", "Custom"]],
     "DefaultValue": "Balanced", "DisplayName": "Workload Profile"},
    {"AttributeName": "ProcTurboMode", "Type": "Enumeration", "ReadOnly": False,
     "Value": [{"ValueName": "Enabled"}, {"ValueName": "Disabled"}], "DefaultValue": "Enabled"},
    {"AttributeName": "ProcCStates", "Type": "Enumeration", "ReadOnly": False,
     "Value": [{"ValueName": "Enabled"}, {"ValueName": "Disabled"}], "DefaultValue": "Enabled"},
    {"AttributeName": "SubNumaCluster", "Type": "Enumeration", "ReadOnly": False,
     "Value": [{"ValueName": "Disabled"}, {"ValueName": "2-Way"}, {"ValueName": "4-Way"}],
     "DefaultValue": "Disabled"},
    {"AttributeName": "PcieRelaxedOrdering", "Type": "Enumeration", "ReadOnly": False,
     "Value": [{"ValueName": "Enabled"}, {"ValueName": "Disabled"}], "DefaultValue": "Enabled"},
    {"AttributeName": "MmioAbove4Gb", "Type": "Enumeration", "ReadOnly": False,
     "Value": [{"ValueName": "Enabled"}, {"ValueName": "Disabled"}], "DefaultValue": "Enabled"},
    {"AttributeName": "MemoryRefreshRate", "Type": "Integer", "ReadOnly": False,
     "LowerBound": 1, "UpperBound": 4, "ScalarIncrement": 1, "DefaultValue": 1},
    {"AttributeName": "SriovGlobalEnable", "Type": "Boolean", "ReadOnly": False,
     "DefaultValue": False},
    {"AttributeName": "BiosVersion", "Type": "String", "ReadOnly": True, "DefaultValue": "2.3.4"},
]


def default_state(registry: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    reg = registry or DEFAULT_REGISTRY
    return {
        "attributes": {a["AttributeName"]: a.get("DefaultValue") for a in reg},
        "pending": {},
        "apply_time": "OnReset",
        "etag": 1,
        "settings_time": None,
        "messages": [],
        "require_if_match": True,
        "fail_on_reset": {},      # attribute -> message text (tests and `sim inject`)
        "resets": 0,
        "power": "On",
        "auth": None,             # {"user": ..., "password": ...} to require HTTP Basic
        "send_etag": True,        # False: a BMC that demands If-Match but never sends an ETag
    }


def init(root: Path, registry: list[dict[str, Any]] | None = None) -> Path:
    """Create DIR/bmc with default state (kept if it exists)."""
    d = Path(root) / "bmc"
    d.mkdir(parents=True, exist_ok=True)
    if not (d / "registry.json").exists():
        _atomic(d / "registry.json", registry or DEFAULT_REGISTRY)
    if not (d / "state.json").exists():
        _atomic(d / "state.json", default_state(registry))
    return d


def _atomic(p: Path, obj: Any) -> None:
    tmp = p.with_name(f".{p.name}.{os.getpid()}.{threading.get_ident()}")
    tmp.write_text(json.dumps(obj, indent=1, sort_keys=True))
    os.replace(tmp, p)


def _msg(mid: str, text: str, severity: str = "Critical", props: list[str] | None = None) -> dict:
    m = {"MessageId": mid, "Message": text, "Severity": severity, "MessageSeverity": severity}
    if props:
        m["RelatedProperties"] = props
    return m


def _error(status: int, mid: str, text: str, props: list[str] | None = None) -> tuple:
    body = {"error": {"code": mid, "message": text,
                      "@Message.ExtendedInfo": [_msg(mid, text, props=props)]}}
    return status, {}, body


class BmcDouble:
    def __init__(self, root: Path):
        self.dir = Path(root) / "bmc"
        if not (self.dir / "state.json").exists():
            init(Path(root))

    # -- state, under an fcntl lock so several processes can share one folder -----------------
    @contextmanager
    def _locked(self) -> Iterator[dict[str, Any]]:
        with open(self.dir / "lock", "a+") as lf:
            fcntl.flock(lf, fcntl.LOCK_EX)
            st = json.loads((self.dir / "state.json").read_text())
            before = copy.deepcopy(st)
            yield st
            if st != before:
                _atomic(self.dir / "state.json", st)

    def state(self) -> dict[str, Any]:
        return json.loads((self.dir / "state.json").read_text())

    def registry(self) -> list[dict[str, Any]]:
        return json.loads((self.dir / "registry.json").read_text())

    def update(self, **kw: Any) -> None:
        """Test hook: change state keys (e.g. fail_on_reset, require_if_match, auth)."""
        with self._locked() as st:
            st.update(kw)

    # -- validation against the attribute registry --------------------------------------------
    def _check(self, name: str, value: Any) -> tuple | None:
        entry = next((a for a in self.registry() if a["AttributeName"] == name), None)
        if entry is None:
            return _error(400, "Base.1.8.PropertyUnknown",
                          f"The property {name} is not in the list of valid properties.",
                          [f"#/Attributes/{name}"])
        if entry.get("ReadOnly") or entry.get("Immutable"):
            return _error(400, "Base.1.8.PropertyNotWritable",
                          f"The property {name} is a read only property.", [f"#/Attributes/{name}"])
        t = entry["Type"]
        ok = (
            (t == "Enumeration" and value in [v["ValueName"] for v in entry["Value"]])
            or (t == "Integer" and isinstance(value, int) and not isinstance(value, bool)
                and entry.get("LowerBound", value) <= value <= entry.get("UpperBound", value))
            or (t == "Boolean" and isinstance(value, bool))
            or (t == "String" and isinstance(value, str))
        )
        if not ok:
            return _error(400, "Base.1.8.PropertyValueNotInList",
                          f"The value {value!r} for the property {name} is not in the list of "
                          f"acceptable values.", [f"#/Attributes/{name}"])
        return None

    # -- one request ---------------------------------------------------------------------------
    def handle(self, method: str, path: str, headers: dict[str, str], body: Any) -> tuple:
        """(status, headers, json body or None)."""
        path = path.split("?", 1)[0].rstrip("/") or "/"
        headers = {k.lower(): v for k, v in headers.items()}
        st = self.state()
        if st.get("auth") and path not in ("/redfish", "/redfish/v1"):
            want = "Basic " + base64.b64encode(
                f"{st['auth']['user']}:{st['auth']['password']}".encode()).decode()
            if headers.get("authorization") != want:
                return _error(401, "Base.1.8.InsufficientPrivilege", "Authentication required.")
        if method == "GET":
            doc = self._get(path, st)
            if doc is None:
                return _error(404, "Base.1.8.ResourceMissingAtURI", f"{path} not found")
            hdr = {"ETag": f'W/"{st["etag"]}"'} if path in (BIOS, SETTINGS) and \
                st.get("send_etag", True) else {}
            return 200, hdr, doc
        if method == "PATCH" and path == SETTINGS:
            return self._patch_settings(headers, body or {})
        if method == "POST" and path == f"{SYS}/Actions/ComputerSystem.Reset":
            return self._reset((body or {}).get("ResetType", "ForceRestart"))
        if method in ("PATCH", "POST", "PUT", "DELETE"):
            return _error(405, "Base.1.8.ActionNotSupported", f"{method} {path} not allowed")
        return _error(405, "Base.1.8.GeneralError", f"method {method} not supported")

    def _get(self, path: str, st: dict[str, Any]) -> dict[str, Any] | None:
        if path in ("/redfish",):
            return {"v1": "/redfish/v1/"}
        if path == "/redfish/v1":
            return {"@odata.id": "/redfish/v1/", "@odata.type": "#ServiceRoot.v1_5_0.ServiceRoot",
                    "Id": "RootService", "RedfishVersion": "1.11.0", "Name": "metaltune BMC double",
                    "Systems": {"@odata.id": "/redfish/v1/Systems"},
                    "Registries": {"@odata.id": "/redfish/v1/Registries"}}
        if path == "/redfish/v1/Systems":
            return {"@odata.id": path, "Members": [{"@odata.id": SYS}], "Members@odata.count": 1}
        if path == SYS:
            return {"@odata.id": SYS, "Id": "1", "Name": "sim GPU server", "PowerState": st["power"],
                    "Manufacturer": "metaltune", "Model": "sim",
                    "Bios": {"@odata.id": BIOS},
                    "Actions": {"#ComputerSystem.Reset": {
                        "target": f"{SYS}/Actions/ComputerSystem.Reset",
                        "ResetType@Redfish.AllowableValues": ["On", "ForceOff", "ForceRestart",
                                                              "GracefulRestart"]}}}
        if path == BIOS:
            settings: dict[str, Any] = {
                "@odata.type": "#Settings.v1_3_0.Settings",
                "SettingsObject": {"@odata.id": SETTINGS},
                "SupportedApplyTimes": APPLY_TIMES,
                "ETag": f'W/"{st["etag"]}"',
            }
            if st["settings_time"]:
                settings["Time"] = st["settings_time"]
                settings["Messages"] = st["messages"]
            return {"@odata.id": BIOS, "@odata.type": "#Bios.v1_1_0.Bios", "Id": "Bios",
                    "Name": "BIOS Configuration Current Settings",
                    "AttributeRegistry": REGISTRY_ID, "Attributes": st["attributes"],
                    "@Redfish.Settings": settings}
        if path == SETTINGS:
            return {"@odata.id": SETTINGS, "@odata.type": "#Bios.v1_1_0.Bios", "Id": "Settings",
                    "Name": "BIOS Configuration Pending Settings",
                    "AttributeRegistry": REGISTRY_ID, "Attributes": st["pending"],
                    "@Redfish.SettingsApplyTime": {
                        "@odata.type": "#Settings.v1_3_0.PreferredApplyTime",
                        "ApplyTime": st["apply_time"],
                        "ApplyTime@Redfish.AllowableValues": APPLY_TIMES}}
        if path == "/redfish/v1/Registries":
            return {"@odata.id": path, "Members": [{"@odata.id": REGISTRY_FILE}],
                    "Members@odata.count": 1}
        if path == REGISTRY_FILE:
            return {"@odata.id": path, "@odata.type": "#MessageRegistryFile.v1_1_0.MessageRegistryFile",
                    "Id": REGISTRY_ID, "Registry": REGISTRY_ID.rsplit(".", 1)[0],
                    "Languages": ["en"], "Location": [{"Language": "en", "Uri": REGISTRY_DOC}]}
        if path == REGISTRY_DOC:
            return {"@odata.type": "#AttributeRegistry.v1_3_0.AttributeRegistry",
                    "Id": REGISTRY_ID, "Language": "en", "OwningEntity": "metaltune",
                    "RegistryVersion": "1.0.0",
                    "RegistryEntries": {"Attributes": self.registry()}}
        return None

    def _patch_settings(self, headers: dict[str, str], body: dict[str, Any]) -> tuple:
        with self._locked() as st:
            etag = f'W/"{st["etag"]}"'
            im = headers.get("if-match")
            if im is None and st["require_if_match"]:
                return _error(428, "Base.1.8.PreconditionRequired",
                              "An If-Match header with the resource's ETag is required.")
            if im is not None and im not in (etag, etag[2:], "*"):
                return _error(412, "Base.1.8.PreconditionFailed",
                              f"The ETag {im} does not match the current ETag {etag}.")
            at = (body.get("@Redfish.SettingsApplyTime") or {}).get("ApplyTime")
            if at is not None and at not in APPLY_TIMES:
                return _error(400, "Base.1.8.PropertyValueNotInList",
                              f"ApplyTime {at!r} is not supported; allowed: {APPLY_TIMES}",
                              ["#/@Redfish.SettingsApplyTime/ApplyTime"])
            attrs = body.get("Attributes")
            if not isinstance(attrs, dict):
                return _error(400, "Base.1.8.PropertyMissing", "The property Attributes is required.")
            for k, v in attrs.items():
                err = self._check(k, v)
                if err:
                    return err
            for k, v in attrs.items():
                if st["attributes"].get(k) == v:
                    st["pending"].pop(k, None)   # back to the current value: nothing waits
                else:
                    st["pending"][k] = v
            if at:
                st["apply_time"] = at
            st["etag"] += 1
            return 204, {"ETag": f'W/"{st["etag"]}"'}, None

    def _reset(self, reset_type: str) -> tuple:
        with self._locked() as st:
            if reset_type in ("ForceOff",):
                st["power"] = "Off"
                return 204, {}, None
            st["power"] = "On"
            st["resets"] += 1
            if not st["pending"]:
                return 204, {}, None
            msgs = []
            for k, v in sorted(st["pending"].items()):
                fail = st["fail_on_reset"].get(k)
                if fail:
                    msgs.append(_msg("Base.1.8.GeneralError", f"{k}: {fail}", "Critical",
                                     [f"#/Attributes/{k}"]))
                else:
                    st["attributes"][k] = v
                    msgs.append(_msg("Base.1.8.Success", f"{k} set to {v!r}", "OK",
                                     [f"#/Attributes/{k}"]))
            st["pending"] = {}
            st["messages"] = msgs
            st["settings_time"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            st["etag"] += 1
            return 204, {}, None


# ---------------------------------------------------------------------------------------------
# HTTP server on 127.0.0.1 (tests) and an in-process requests adapter (sim hosts).


def serve(root: Path, port: int = 0) -> tuple[http.server.ThreadingHTTPServer, str]:
    """Start a server thread on 127.0.0.1; returns (server, base URL). Stop with shutdown()."""
    bmc = BmcDouble(root)

    class H(http.server.BaseHTTPRequestHandler):
        def _do(self) -> None:
            n = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(n) if n else b""
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                status, hdr, doc = _error(400, "Base.1.8.MalformedJSON", "malformed JSON")
            else:
                status, hdr, doc = bmc.handle(self.command, self.path, dict(self.headers), body)
            out = json.dumps(doc).encode() if doc is not None else b""
            self.send_response(status)
            for k, v in hdr.items():
                self.send_header(k, v)
            if out:
                self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        do_GET = do_PATCH = do_POST = do_PUT = do_DELETE = _do

        def log_message(self, *a: Any) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", port), H)
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}"


def adapter(root: Path) -> Any:
    """A requests transport adapter answering from the BMC double in this process."""
    import requests
    from requests.adapters import BaseAdapter

    bmc = BmcDouble(root)

    class _Adapter(BaseAdapter):
        def send(self, request: Any, **kw: Any) -> Any:
            from urllib.parse import urlsplit

            raw = request.body
            if isinstance(raw, str):
                raw = raw.encode()
            body = json.loads(raw) if raw else None
            status, hdr, doc = bmc.handle(request.method, urlsplit(request.url).path,
                                          dict(request.headers), body)
            r = requests.Response()
            r.status_code = status
            r.headers.update(hdr)
            if doc is not None:
                r.headers["Content-Type"] = "application/json"
            r._content = json.dumps(doc).encode() if doc is not None else b""
            r.raw = io.BytesIO(r._content)
            r.url = request.url
            r.request = request
            r.reason = http.HTTPStatus(status).phrase
            return r

        def close(self) -> None:
            pass

    return _Adapter()
