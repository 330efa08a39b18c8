"""Device state of a simulated host: DIR/nvml/state.json, written atomically (temp file + fsync +
rename) under an fcntl lock on DIR/nvml/lock, so any number of processes (CLI, daemon, tests) share
one host and a kill -9 at any instant leaves either the old or the new state, never a torn one.

Also the two append-only logs a real host has: NVML events (DIR/nvml/events.jsonl, read by the fake
event-set API) and the kernel log (DIR/dev/kmsg, in /dev/kmsg record format).
"""
from __future__ import annotations

import fcntl
import json
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from tuner.errors import BadInput


def atomic_write(path: Path, data: str | bytes, durable: bool = False) -> None:
    """Replace `path` whole. The rename alone is atomic against the death of any process, which
    is what a simulated device must survive (a real GPU's NVML state does not survive power loss
    either), so fsync is only done when asked: it cost ~6 ms a write and dominated the demo."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    mode = "wb" if isinstance(data, bytes) else "w"
    with open(tmp, mode) as f:
        f.write(data)
        if durable:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)
    if durable:
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


class SimState:
    def __init__(self, root: str | os.PathLike[str]):
        self.root = Path(root)
        self.dir = self.root / "nvml"
        self.file = self.dir / "state.json"
        self.events = self.dir / "events.jsonl"
        self.kmsg = self.root / "dev" / "kmsg"

    def check(self) -> None:
        if not self.file.is_file():
            raise BadInput(f"{self.root}: not a simulated host (no nvml/state.json); "
                           f"create one with `metaltune sim init {self.root}`")

    @contextmanager
    def _lock(self, exclusive: bool) -> Iterator[None]:
        fd = os.open(self.dir / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def read(self) -> dict[str, Any]:
        """A consistent snapshot (the file is only ever replaced whole, so no lock is needed)."""
        self.check()
        with open(self.file) as f:
            return json.load(f)

    @contextmanager
    def edit(self) -> Iterator[dict[str, Any]]:
        """Exclusive read-modify-write; the state is written back only if the block succeeds."""
        self.check()
        with self._lock(True):
            with open(self.file) as f:
                st = json.load(f)
            before = json.dumps(st, sort_keys=True)
            yield st
            after = json.dumps(st, sort_keys=True)
            if after != before:
                atomic_write(self.file, json.dumps(st, indent=1, sort_keys=True) + "\n")

    # -- logs (call inside edit(): seq numbers live in the state) ------------------------------
    def add_event(self, st: dict[str, Any], gpu: int, event_type: int, data: int) -> int:
        st["event_seq"] = seq = int(st.get("event_seq", 0)) + 1
        line = json.dumps({"seq": seq, "gpu": gpu, "type": event_type, "data": data,
                           "time": time.time()})
        _append(self.events, line + "\n")
        return seq

    def add_kmsg(self, st: dict[str, Any], msg: str, level: int = 4) -> None:
        st["kmsg_seq"] = seq = int(st.get("kmsg_seq", 0)) + 1
        usec = int((time.time() - float(st.get("boot_time", time.time()))) * 1e6)
        _append(self.kmsg, f"{level},{seq},{max(usec, 0)},-;{msg}\n")

    def read_events(self, after_seq: int) -> list[dict[str, Any]]:
        out = []
        try:
            with open(self.events) as f:
                for line in f:
                    line = line.strip()
                    if not line:
                        continue
                    try:
                        ev = json.loads(line)
                    except ValueError:  # a torn last line after a crash: skip it
                        continue
                    if ev["seq"] > after_seq:
                        out.append(ev)
        except FileNotFoundError:
            pass
        return out


def _append(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
