"""systemd-boot: a Boot Loader Specification entry with boot counting.

The trial is `/boot/loader/entries/metaltune-trial-N+1.conf` (a copy of the default entry with new
options): `+1` is one try. systemd-boot renames it to `+0-1` as it boots it; `systemd-bless-boot`
(and this adapter, which blesses only after the gate) renames a good one to `ID.conf` and a bad one
to `ID+0-DONE.conf`, sorted last and never picked again. It is armed for the next boot only with
`bootctl set-oneshot ID.conf` (the LoaderEntryOneShot EFI variable, consumed by that boot), and
promoted with `bootctl set-default ID.conf`.
"""
from __future__ import annotations

import fnmatch
import re
from pathlib import Path
from typing import Any, Optional

from tuner.boot import efivars
from tuner.boot.commands import Actions
from tuner.errors import OperationFailed

COUNTED = re.compile(r"^(?P<id>.+?)\+(?P<left>\d+)(?:-(?P<done>\d+))?\.conf$")


def split_name(name: str) -> tuple[str, Optional[int], Optional[int]]:
    """`a+3-1.conf` -> ("a", 3, 1); `a+2.conf` -> ("a", 2, 0); `a.conf` -> ("a", None, None):
    the boot-counting grammar systemd-boot and systemd-bless-boot read."""
    m = COUNTED.match(name)
    if m:
        return m.group("id"), int(m.group("left")), int(m.group("done") or 0)
    return name.removesuffix(".conf"), None, None


def counted_name(ident: str, left: Optional[int], done: Optional[int]) -> str:
    if left is None:
        return f"{ident}.conf"
    return f"{ident}+{left}-{done}.conf" if done else f"{ident}+{left}.conf"


def blessed_name(name: str) -> str:
    """What `systemd-bless-boot good` renames an entry to."""
    return counted_name(split_name(name)[0], None, None)


def bad_name(name: str) -> str:
    """What `systemd-bless-boot bad` renames an entry to: no tries left."""
    ident, left, done = split_name(name)
    return counted_name(ident, 0, (done or 0) if left is not None else 0) if left is not None \
        else name


def parse_entry(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            k, _, v = line.partition(" ")
            out[k] = (out[k] + " " + v.strip()) if k in out and k == "options" else v.strip()
    return out


class Bls:
    kind = "systemd-boot"

    def __init__(self, host: Any, actions: Optional[Actions] = None):
        self.host = host
        self.act = actions or Actions(host)
        self.dir = host.path("/boot/loader/entries")
        self.conf = host.path("/boot/loader/loader.conf")

    def check(self) -> None:
        if not self.dir.is_dir():
            raise OperationFailed(f"{self.dir}: no Boot Loader Specification entries on this host")

    def files(self) -> list[Path]:
        try:
            return sorted(p for p in self.dir.iterdir() if p.name.endswith(".conf"))
        except OSError:
            return []

    def file_of(self, ident: str) -> Optional[Path]:
        ident = ident.removesuffix(".conf")
        return next((p for p in self.files() if split_name(p.name)[0] == ident), None)

    def boot_order(self) -> list[Path]:
        """Entries in menu order, as systemd-boot sorts them: those with no tries left last,
        the others newest (highest name) first."""
        files = sorted(self.files(), key=lambda p: p.name, reverse=True)
        return sorted(files, key=lambda p: split_name(p.name)[1] == 0)

    def pinned(self) -> bool:
        """Whether the default is named (EFI variable or loader.conf), not just the first."""
        if efivars.read(self.host, "LoaderEntryDefault"):
            return True
        try:
            return any(ln.split()[:1] == ["default"] for ln in self.conf.read_text().splitlines())
        except OSError:
            return False

    def default(self) -> Optional[str]:
        """The entry booted when no one-shot is set: LoaderEntryDefault, loader.conf's pattern,
        else the first in menu order."""
        v = efivars.read(self.host, "LoaderEntryDefault")
        if v:
            return v.removesuffix(".conf")
        pat = None
        try:
            for line in self.conf.read_text().splitlines():
                k, _, val = line.strip().partition(" ")
                if k == "default":
                    pat = val.strip()
        except OSError:
            pass
        order = self.boot_order()
        for p in order:
            if pat is None or fnmatch.fnmatch(split_name(p.name)[0] + ".conf", pat) or \
                    fnmatch.fnmatch(split_name(p.name)[0], pat):
                return split_name(p.name)[0]
        return None

    def default_entry(self) -> dict[str, Any]:
        d = self.default()
        p = self.file_of(d) if d else None
        if p is None:
            raise OperationFailed(f"{self.dir}: cannot find the default entry {d!r}")
        return {"id": d, "file": p, **parse_entry(p.read_text())}

    def options_of(self, entry: Optional[str]) -> str:
        p = self.file_of(entry) if entry else None
        return parse_entry(p.read_text()).get("options", "") if p else ""

    def armed(self) -> Optional[str]:
        v = efivars.read(self.host, "LoaderEntryOneShot")
        return v.removesuffix(".conf") if v else None

    def state(self) -> dict[str, Any]:
        return {"loader": self.kind, "entries_dir": str(self.dir), "default": self.default(),
                "oneshot": self.armed(), "entries": [p.name for p in self.boot_order()]}

    def write_trial(self, entry: str, options: str, title: str) -> None:
        base = self.default_entry()
        if not self.pinned():  # a new entry sorts first: it must not become the default by name
            self.act.run(["bootctl", "set-default", f"{base['id']}.conf"])
        old = self.file_of(entry)
        if old is not None:
            self.act.remove(old)
        text = base["file"].read_text()
        lines = [ln for ln in text.splitlines() if ln.split(" ", 1)[0] not in ("title", "options")]
        body = f"title {title}\n" + "\n".join(lines) + f"\noptions {options}\n"
        self.act.write(self.dir / counted_name(entry, 1, 0), body)

    def arm_once(self, entry: str) -> None:
        self.act.run(["bootctl", "set-oneshot", f"{entry}.conf"])

    def disarm(self) -> None:
        if self.armed() is not None or self.act.dry_run:
            self.act.run(["bootctl", "set-oneshot", ""])

    def promote(self, entry: str) -> None:
        p = self.file_of(entry)
        if p is None:
            raise OperationFailed(f"{self.dir}: trial entry {entry} is gone")
        if p.name != blessed_name(p.name):
            self.act.rename(p, p.with_name(blessed_name(p.name)))
        self.act.run(["bootctl", "set-default", f"{entry}.conf"])

    def demote(self, entry: str) -> None:
        if self.armed() == entry:
            self.disarm()
        p = self.file_of(entry)
        if p is not None:
            left = split_name(p.name)[1]
            if left is None:  # never counted (a blessed entry): make it one with no tries
                self.act.rename(p, p.with_name(counted_name(entry, 0, 1)))
            elif left:
                self.act.rename(p, p.with_name(bad_name(p.name)))
