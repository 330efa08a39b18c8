"""GRUB 2: a one-shot trial entry, GRUB's own `grub-reboot` semantics.

The trial is a menuentry in `custom.cfg` beside grub.cfg (sourced by grub.cfg's 41_custom part at
every boot, so no `update-grub` run is needed), between metaltune's markers; a copy of the default
entry with new kernel options. It is armed with `grub-editenv ENV set next_entry=ID`, which is what
`grub-reboot` writes: grub.cfg boots `next_entry` once and clears it before loading the kernel, so
the boot after a panic or a watchdog reset is the saved default again. Promotion is
`grub-set-default`'s write (`saved_entry=ID`); both need `GRUB_DEFAULT=saved` in /etc/default/grub.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Optional

from tuner.boot.commands import Actions
from tuner.errors import OperationFailed

BEGIN, END = "### BEGIN metaltune trial entries ###", "### END metaltune trial entries ###"
_ENTRY = re.compile(r"^\s*menuentry\s+(?P<head>[^{]*)\{", re.M)
_ID = re.compile(r"--id\s+['\"]?([^'\"\s]+)")
_TITLE = re.compile(r"^\s*['\"]([^'\"]*)['\"]")


def parse_entries(text: str) -> list[dict[str, Any]]:
    """Every menuentry of a grub.cfg-like text: id, title, body and the `linux` line's options."""
    out = []
    for m in _ENTRY.finditer(text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        body = text[m.end():i - 1]
        head = m.group("head")
        ident = _ID.search(head)
        title = _TITLE.search(head)
        linux = re.search(r"^\s*linux(?:efi)?\s+(\S+)(.*)$", body, re.M)
        out.append({"id": ident.group(1) if ident else None,
                    "title": title.group(1) if title else None, "body": body,
                    "kernel": linux.group(1) if linux else None,
                    "options": linux.group(2).strip() if linux else ""})
    return out


def read_env(path: Path) -> dict[str, str]:
    """A grubenv block as GRUB reads it (`#` lines are padding and the header)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return {}
    env = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and "=" in line:
            k, _, v = line.partition("=")
            env[k] = v
    return env


class Grub:
    kind = "grub"

    def __init__(self, host: Any, actions: Optional[Actions] = None):
        self.host = host
        self.act = actions or Actions(host)
        base = "/boot/grub2" if host.path("/boot/grub2/grub.cfg").exists() else "/boot/grub"
        self.cfg = host.path(f"{base}/grub.cfg")
        self.custom = host.path(f"{base}/custom.cfg")
        self.env = host.path(f"{base}/grubenv")

    # -- reads -----------------------------------------------------------------------------
    def check(self) -> None:
        if not self.cfg.is_file():
            raise OperationFailed(f"{self.cfg}: no GRUB configuration on this host")
        if not self.env.is_file():
            raise OperationFailed(f"{self.env}: no grubenv (create it with `grub-editenv "
                                  f"{self.env} create`)")
        try:
            dflt = self.host.path("/etc/default/grub").read_text()
        except OSError:
            dflt = ""
        if not re.search(r"^\s*GRUB_DEFAULT=[\"']?saved\b", dflt, re.M):
            raise OperationFailed("GRUB_DEFAULT is not `saved` in /etc/default/grub: a one-shot "
                                  "boot (grub-reboot) needs it; set it and run update-grub")

    def entries(self) -> list[dict[str, Any]]:
        text = ""
        for p in (self.cfg, self.custom):
            try:
                text += p.read_text(errors="replace") + "\n"
            except OSError:
                pass
        return parse_entries(text)

    def find(self, name: Optional[str]) -> Optional[dict[str, Any]]:
        ents = self.entries()
        if not ents:
            return None
        if name is None or name == "":
            return ents[0]
        if name.isdigit():
            i = int(name)
            return ents[i] if i < len(ents) else None
        return next((e for e in ents if name in (e["id"], e["title"])), None)

    def default(self) -> Optional[str]:
        """The entry GRUB boots when nothing is armed (saved_entry; None: the first one)."""
        return read_env(self.env).get("saved_entry") or None

    def default_entry(self) -> dict[str, Any]:
        e = self.find(self.default())
        if e is None:
            raise OperationFailed(f"{self.cfg}: cannot find the default entry {self.default()!r}")
        return e

    def armed(self) -> Optional[str]:
        return read_env(self.env).get("next_entry") or None

    def state(self) -> dict[str, Any]:
        return {"loader": self.kind, "config": str(self.cfg), "grubenv": str(self.env),
                "default": self.default(), "next_entry": self.armed(),
                "entries": [e["id"] or e["title"] for e in self.entries()]}

    # -- writes ----------------------------------------------------------------------------
    def _blocks(self) -> tuple[str, list[str], str]:
        try:
            text = self.custom.read_text()
        except FileNotFoundError:
            text = ""
        if BEGIN in text and END in text:
            pre, rest = text.split(BEGIN, 1)
            mid, post = rest.split(END, 1)
        else:
            pre, mid, post = text, "", ""
        blocks = [b.strip() for b in re.split(r"^(?=menuentry )", mid, flags=re.M) if b.strip()]
        return pre, blocks, post

    def _save(self, pre: str, blocks: list[str], post: str) -> None:
        body = pre.rstrip("\n") + ("\n" if pre.strip() else "")
        if blocks:
            body += BEGIN + "\n" + "\n".join(blocks) + "\n" + END + "\n"
        body += post.lstrip("\n")
        if body.strip():
            self.act.write(self.custom, body)
        else:
            self.act.remove(self.custom)

    def write_trial(self, entry: str, options: str, title: str) -> None:
        base = self.default_entry()
        body = re.sub(r"^(\s*linux(?:efi)?\s+\S+).*$", lambda m: f"{m.group(1)} {options}",
                      base["body"], count=1, flags=re.M)
        pre, blocks, post = self._blocks()
        blocks = [b for b in blocks if f"--id '{entry}'" not in b]
        blocks.append(f"menuentry '{title}' --id '{entry}' {{{body.rstrip()}\n}}")
        self._save(pre, blocks, post)

    def options_of(self, entry: Optional[str]) -> str:
        e = self.find(entry)
        return e["options"] if e else ""

    def arm_once(self, entry: str) -> None:
        self.act.run(["grub-editenv", str(self.env), "set", f"next_entry={entry}"])

    def disarm(self) -> None:
        if self.armed() is not None or self.act.dry_run:
            self.act.run(["grub-editenv", str(self.env), "unset", "next_entry"])

    def promote(self, entry: str) -> None:
        self.act.run(["grub-editenv", str(self.env), "set", f"saved_entry={entry}"])
        pre, blocks, post = self._blocks()  # older metaltune entries nothing boots any more
        keep = [b for b in blocks if f"--id '{entry}'" in b]
        if keep != blocks:
            self._save(pre, keep, post)

    def demote(self, entry: str) -> None:
        """Never bootable again: not armed, and its menuentry gone (the default is untouched)."""
        if self.armed() == entry:
            self.disarm()
        pre, blocks, post = self._blocks()
        rest = [b for b in blocks if f"--id '{entry}'" not in b]
        if rest != blocks:
            self._save(pre, rest, post)
