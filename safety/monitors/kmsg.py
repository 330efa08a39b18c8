"""`NVRM: Xid` lines from the kernel log (<root>/dev/kmsg).

The real /dev/kmsg is a character device: one record (`prio,seq,usec,flags;message`) per read,
EAGAIN when nothing is new, EPIPE when records we had not read yet were overwritten. The
simulated host's is a plain file of lines, read from the offset seen at `arm()`."""
from __future__ import annotations

import errno
import os
import re
import stat
from pathlib import Path
from typing import Iterable, Optional

from safety.incident import FATAL_XIDS, Incident, classify_xid
from safety.monitors.base import Monitor

XID_RE = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9A-Fa-f:.]+)\): (\d+)(?:,\s*(.*))?")


def parse_xid(line: str) -> Optional[tuple[str, int, str]]:
    m = XID_RE.search(line)
    if not m:
        return None
    return m.group(1).lower(), int(m.group(2)), (m.group(3) or "").strip()


class KmsgXidMonitor(Monitor):
    name = "kmsg_xid"

    def __init__(self, root: str | os.PathLike[str] = "/", path: str = "dev/kmsg",
                 fatal_xids: Iterable[int] = FATAL_XIDS):
        self.path = Path(root) / path
        self.fatal_xids = frozenset(fatal_xids)
        self._fd: Optional[int] = None
        self._offset = 0
        self._buf = b""
        self.device = False

    def arm(self) -> None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self.device, self._offset = False, 0  # appears later: read it from the start
            return
        self.device = stat.S_ISCHR(st.st_mode)
        if self.device:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            os.lseek(self._fd, 0, os.SEEK_END)  # skip the backlog
        else:
            self._offset, self._buf = st.st_size, b""

    def _lines(self) -> list[str]:
        if self.device:
            out = []
            while True:
                try:
                    rec = os.read(self._fd, 8192)  # one record per read
                except BlockingIOError:
                    return out
                except OSError as e:
                    if e.errno == errno.EPIPE:
                        continue  # ring buffer overran us; the next read resumes
                    raise
                if not rec:
                    return out
                text = rec.decode(errors="replace")
                out.append(text.split(";", 1)[1] if ";" in text.split("\n", 1)[0] else text)
        try:
            with open(self.path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size < self._offset:  # truncated / replaced
                    self._offset, self._buf = 0, b""
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self._offset += len(data)
        data = self._buf + data
        *lines, self._buf = data.split(b"\n")
        return [ln.decode(errors="replace") for ln in lines]

    def poll(self) -> list[Incident]:
        out = []
        for line in self._lines():
            hit = parse_xid(line)
            if hit is None:
                continue
            bdf, xid, rest = hit
            sev = "fatal" if xid in self.fatal_xids else classify_xid(xid)
            out.append(self.incident("xid", sev, f"Xid {xid} on {bdf}: {rest}".rstrip(": "),
                                     xid=xid, gpu=bdf, data={"line": line.strip()}))
        return out

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
