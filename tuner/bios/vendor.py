"""BIOS through the vendors' command-line tools, run with `host.run` (so tests point them at
recording executables in a sim host's bin/). Command lines follow each tool's documented syntax:

- Dell `racadm`: `racadm get BIOS.<Group>.<Attr>` / `racadm set BIOS.<Group>.<Attr> <v>`, then
  `racadm jobqueue create BIOS.Setup.1-1` (staged for the next reboot; no `-r`: we never reboot).
  Out of band: `racadm -r <bmc> -u <user> -p <pw> --nocertwarn ...`.
- HPE `ilorest`: `ilorest get <Attr> --select Bios. --json`, `ilorest set <Attr>=<v> --select Bios.
  --commit`, `ilorest pending --json`. Out of band: `--url <bmc> -u <user> -p <pw>` on each call.
- Supermicro `sum`: `sum -c GetCurrentBiosCfg --file F --overwrite` (XML), edit, `sum -c
  ChangeBiosCfg --file F`. Out of band: `sum -i <bmc> -u <user> -p <pw> ...`.
- Lenovo `onecli`: `onecli config show <Setting>`, `onecli config set <Setting> <v>`. Out of band:
  `--bmc <user>:<pw>@<bmc>`.

Attribute names are the tool's own (Dell's `Group.Attr`, Lenovo's `Group.Setting`). None of these
tools gives a machine-readable attribute registry in one call, so the domain comes from the config
file's `values:`; an attribute without one is read-only for metaltune. Passwords on a command line
are visible in `ps` on the running host: prefer in-band use (no `bmc_host`), as the tools allow.
"""
from __future__ import annotations

import json
import re
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Optional, Sequence

from tuner.errors import KnobUnavailable, OperationFailed


def redact(argv: Sequence[str], secret: Optional[str]) -> list[str]:
    out = list(argv)
    if secret:
        out = [a.replace(secret, "***") for a in out]
    return out


class VendorBios:
    tool = ""

    def __init__(self, host: Any, cfg: Any, password: Optional[str] = None):
        self.host, self.cfg, self._pw = host, cfg, password

    def _remote(self) -> list[str]:
        return []

    def _run(self, *args: str, check: bool = True) -> str:
        argv = [self.tool, *self._remote(), *args]
        try:
            cp = self.host.run(argv, timeout=self.cfg.timeout_s)
        except FileNotFoundError:
            raise KnobUnavailable(f"{self.tool} is not installed") from None
        if check and cp.returncode != 0:
            raise OperationFailed(f"{' '.join(redact(argv, self._pw))}: exit {cp.returncode}: "
                                  f"{(cp.stderr or cp.stdout).strip()[:300]}")
        return cp.stdout

    # the shared interface (as RedfishBios)
    def registry(self) -> list[dict[str, Any]]:
        names = self.cfg.attributes or list(self.cfg.values)
        return [{"AttributeName": n, "Type": "Enumeration" if n in self.cfg.values else "String",
                 "ReadOnly": n not in self.cfg.values,
                 "Value": [{"ValueName": v} for v in self.cfg.values.get(n, [])]} for n in names]

    def current(self) -> dict[str, Any]:
        return {a["AttributeName"]: self.get(a["AttributeName"]) for a in self.registry()}

    def get(self, name: str) -> Any:
        raise NotImplementedError

    def pending(self) -> dict[str, Any]:
        return {}

    def set(self, attrs: dict[str, Any]) -> None:
        raise NotImplementedError

    def clear(self, names: list[str]) -> None:
        pend = self.pending()
        cur = {n: self.get(n) for n in names if n in pend}
        if cur:
            self.set(cur)

    def last_result(self) -> dict[str, Any]:
        return {"time": None, "messages": [], "failed": []}

    def close(self) -> None:
        pass


class Racadm(VendorBios):
    tool = "racadm"
    _LINE = re.compile(r"^(?P<k>[A-Za-z0-9_]+)=(?P<v>.*?)(?:\s+\(Pending Value=(?P<p>.*)\))?$")

    def _remote(self) -> list[str]:
        if not self.cfg.bmc_host:
            return []
        return ["-r", self.cfg.bmc_host, "-u", self.cfg.username or "root", "-p", self._pw or "",
                "--nocertwarn"]

    def _parse(self, out: str, name: str) -> tuple[Optional[str], Optional[str]]:
        attr = name.rsplit(".", 1)[-1]
        for line in out.splitlines():
            m = self._LINE.match(line.strip())
            if m and m.group("k") == attr:
                return m.group("v"), m.group("p")
        raise OperationFailed(f"racadm get BIOS.{name}: no {attr}= line in output")

    def get(self, name: str) -> Any:
        return self._parse(self._run("get", f"BIOS.{name}"), name)[0]

    def pending(self) -> dict[str, Any]:
        out = {}
        for a in self.registry():
            n = a["AttributeName"]
            cur, pend = self._parse(self._run("get", f"BIOS.{n}"), n)
            if pend is not None and pend != cur:
                out[n] = pend
        return out

    def set(self, attrs: dict[str, Any]) -> None:
        for n, v in attrs.items():
            self._run("set", f"BIOS.{n}", str(v))
        # a BIOS configuration job applies the staged values at the next reboot (no -r: we never
        # reboot the host ourselves)
        self._run("jobqueue", "create", "BIOS.Setup.1-1")

    def clear(self, names: list[str]) -> None:
        # Staged values with a scheduled job are dropped by deleting that job; the values alone
        # are discarded by setting the current value again.
        out = self._run("jobqueue", "view", check=False)
        for jid, name in re.findall(r"\[Job ID=(JID_\d+)\]\s*\n\s*Job Name=([^\n]+)", out):
            if "BIOS" in name.upper() or "CONFIGURE: BIOS" in name.upper():
                self._run("jobqueue", "delete", "-i", jid)
        super().clear(names)


class Ilorest(VendorBios):
    tool = "ilorest"

    def _remote(self) -> list[str]:
        if not self.cfg.bmc_host:
            return []
        return ["--url", self.cfg.bmc_host, "-u", self.cfg.username or "Administrator",
                "-p", self._pw or ""]

    def get(self, name: str) -> Any:
        out = self._run("get", name, "--select", "Bios.", "--json")
        try:
            return json.loads(out)[name]
        except (ValueError, KeyError):
            raise OperationFailed(f"ilorest get {name}: unexpected output {out[:200]!r}") from None

    def pending(self) -> dict[str, Any]:
        out = self._run("pending", "--json", check=False)
        try:
            doc = json.loads(out or "{}")
        except ValueError:
            return {}
        attrs = doc.get("Bios", doc).get("Attributes", {}) if isinstance(doc, dict) else {}
        cur = {n: self.get(n) for n in attrs if n in self.cfg.values}
        return {k: v for k, v in attrs.items() if k in cur and cur[k] != v}

    def set(self, attrs: dict[str, Any]) -> None:
        self._run("set", *[f"{n}={v}" for n, v in attrs.items()], "--select", "Bios.", "--commit")


class _RememberStaged(VendorBios):
    """For tools with no view of staged values (SUM, OneCLI): metaltune remembers what it staged
    in /var/lib/metaltune/bios-staged.json (under the host's root) until the value is in force
    or the change is cleared."""

    def _file(self) -> Path:
        return self.host.path("/var/lib/metaltune/bios-staged.json")

    def _staged(self) -> dict[str, Any]:
        try:
            return json.loads(self._file().read_text())
        except (OSError, ValueError):
            return {}

    def _remember(self, d: dict[str, Any]) -> None:
        from tuner.knobs._files import atomic_write

        atomic_write(self._file(), json.dumps(d, sort_keys=True), mode=0o600)

    def pending(self) -> dict[str, Any]:
        st = self._staged()
        live = {k: v for k, v in st.items() if self.get(k) != v}
        if live != st:
            self._remember(live)
        return live

    def set(self, attrs: dict[str, Any]) -> None:
        self._set(attrs)
        st = self._staged()
        st.update(attrs)
        self._remember(st)

    def clear(self, names: list[str]) -> None:
        st = self._staged()
        todo = {n: self.get(n) for n in names if n in st}
        if todo:
            self._set(todo)
        self._remember({k: v for k, v in st.items() if k not in names})

    def _set(self, attrs: dict[str, Any]) -> None:
        raise NotImplementedError


class Sum(_RememberStaged):
    tool = "sum"

    def _remote(self) -> list[str]:
        if not self.cfg.bmc_host:
            return []
        return ["-i", self.cfg.bmc_host, "-u", self.cfg.username or "ADMIN", "-p", self._pw or ""]

    def _cfg(self) -> ET.Element:
        with tempfile.TemporaryDirectory() as td:
            f = Path(td) / "bios.xml"
            self._run("-c", "GetCurrentBiosCfg", "--file", str(f), "--overwrite")
            try:
                return ET.parse(f).getroot()
            except (ET.ParseError, OSError) as e:
                raise OperationFailed(f"sum GetCurrentBiosCfg: unreadable XML: {e}") from None

    @staticmethod
    def _find(root: ET.Element, name: str) -> Optional[ET.Element]:
        for s in root.iter("Setting"):
            if s.get("name") == name:
                return s
        return None

    def get(self, name: str) -> Any:
        s = self._find(self._cfg(), name)
        if s is None:
            raise OperationFailed(f"sum: no BIOS setting {name!r}")
        return s.get("selectedOption")

    def _set(self, attrs: dict[str, Any]) -> None:
        root = self._cfg()
        for n, v in attrs.items():
            s = self._find(root, n)
            if s is None:
                raise OperationFailed(f"sum: no BIOS setting {n!r}")
            s.set("selectedOption", str(v))
        with tempfile.TemporaryDirectory() as td:
            f = Path(td) / "bios-new.xml"
            ET.ElementTree(root).write(f)
            self._run("-c", "ChangeBiosCfg", "--file", str(f))


class OneCli(_RememberStaged):
    tool = "onecli"

    def _remote(self) -> list[str]:
        return []

    def _bmc(self) -> list[str]:
        if not self.cfg.bmc_host:
            return []
        return ["--bmc", f"{self.cfg.username or 'USERID'}:{self._pw or ''}@{self.cfg.bmc_host}"]

    def get(self, name: str) -> Any:
        out = self._run("config", "show", name, *self._bmc())
        for line in out.splitlines():
            k, sep, v = line.strip().partition("=")
            if sep and k == name:
                return v
        raise OperationFailed(f"onecli config show {name}: no {name}= line")

    def _set(self, attrs: dict[str, Any]) -> None:
        for n, v in attrs.items():
            self._run("config", "set", n, str(v), *self._bmc())


ADAPTERS = {"racadm": Racadm, "ilorest": Ilorest, "sum": Sum, "onecli": OneCli}
