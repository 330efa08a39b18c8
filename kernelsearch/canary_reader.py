"""The kernel canary's incident log read back as safety incidents, for a journal to take.

A model process's kernel canary (`kernelsearch.canary`) that catches an installed kernel
computing wrong removes its entry, quarantines its source and appends one JSON line to
STATE_DIR/kernels/canary.jsonl; the canary knows no journal. This monitor reads those lines
(untrusted input: the model may run as anyone that can write there; each line is bounded and
validated) and turns each into a fatal `canary_kernel` incident naming the source digest,
family, variant, shape and error, so the safety layer's normal handling applies: the daemon's
incident queue journals it against the kernel table change in force (`kernels.table`), or an
open transaction, and rolls that back; an apply's probation rolls itself back.

The daemon's instance keeps a cursor (STATE_DIR/kernels/canary.cursor: the file's inode and the
offset read), so lines written while it was down are journalled when it starts; a
transaction's instance reads what is new since its `arm()`. The cursor is a state file like any
other: read only as a small regular file (a FIFO is never waited on, a damaged one means "from
the start of the log"; lines read twice are de-duplicated by id), written through a fresh
temporary file that never blocks, so the health loop never waits on it. A line that is not an
incident (garbage, over MAX_LINE bytes, nested deeper than safety.inputs.MAX_DEPTH, checked
before it is parsed) is counted (`skipped`), logged once a minute and passed over. A source
the model process could not quarantine (a read-only store) is quarantined here, in this host's
store, by digest only: nothing here imports or runs it."""
from __future__ import annotations

import json
import logging
import os
import re
import time
from pathlib import Path
from typing import Any, Collection, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from kernelsearch.canary import LOG_NAME, MAX_LINE
from safety.incident import Incident
from safety.monitors.base import Monitor

log = logging.getLogger("metaltune.kernel_canary")

TYPE = "canary_kernel"
CURSOR_NAME = "canary.cursor"
MAX_READ = 1 << 20  # per poll: a flood of lines is read over several ticks
_SHA = re.compile(r"^[0-9a-f]{64}$")


class CanaryLine(BaseModel):
    """One line of the incident log, as kernelsearch.canary writes it (extra keys ignored)."""
    model_config = ConfigDict(extra="ignore")

    v: int = Field(1, ge=1, le=1)
    kind: str = Field(pattern=r"^canary_failure$")
    id: str = Field(pattern=r"^[0-9a-f]{8,64}$")
    time: float = Field(ge=0)
    family: str = Field(max_length=64)
    variant: str = Field(max_length=200)
    #: null for a shipped variant (no stored source): read as ""
    source_sha256: str = Field("", max_length=64)
    config: dict[str, Any] = Field(default_factory=dict)
    shape: list[int] = Field(default_factory=list, max_length=16)
    dtype: str = Field("", max_length=32)
    detail: str = Field("", max_length=2000)
    max_abs_error: Optional[float] = None
    nonfinite: Optional[int] = None
    removed_entries: int = 0
    quarantined: str = Field("", max_length=2000)
    pid: Optional[int] = None

    @field_validator("source_sha256", mode="before")
    @classmethod
    def _no_source(cls, v: Any) -> Any:
        return "" if v is None else v


def log_path(state_dir: Path) -> Path:
    return Path(state_dir) / "kernels" / LOG_NAME


def recent(state_dir: Path, n: int = 10) -> list[dict[str, Any]]:
    """The last `n` removals in the incident log, newest last, read without a daemon (a user's
    own process patched with the integration writes there too): what `metaltune status` shows
    whether or not a daemon journalled them. The same bounds as the monitor's: the log's last
    MAX_READ bytes, a regular file never followed through a link, only lines that validate."""
    from safety.inputs import parse_json

    path = log_path(state_dir)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:  # none yet (or a link: never followed)
        return []
    try:
        st = os.fstat(fd)
        if not _regular(st.st_mode) or n <= 0:
            return []
        data = os.pread(fd, MAX_READ, max(0, st.st_size - MAX_READ))
    finally:
        os.close(fd)
    out: list[dict[str, Any]] = []
    for raw in data.split(b"\n"):
        if not raw or len(raw) > MAX_LINE:
            continue
        try:
            ln = CanaryLine.model_validate(parse_json(raw.decode(), "line", ValueError))
        except (ValueError, ValidationError, RecursionError, UnicodeDecodeError):
            continue  # the first line of a tail cut mid-way, or not an incident
        out.append({"id": ln.id, "time": ln.time, "family": ln.family, "variant": ln.variant,
                    "dtype": ln.dtype, "shape": ln.shape, "removed_entries": ln.removed_entries,
                    "source_sha256": ln.source_sha256, "detail": ln.detail[:500],
                    "pid": ln.pid})
    return out[-n:]


class KernelCanaryMonitor(Monitor):
    name = "kernel_canary"

    def __init__(self, state_dir: Path, cursor: bool = False):
        kdir = Path(state_dir) / "kernels"
        self.path = kdir / LOG_NAME
        self.store = kdir / "sources"
        self.cursor_path: Optional[Path] = kdir / CURSOR_NAME if cursor else None
        self._ino: Optional[int] = None
        self._off = 0
        self._bad_said = 0.0
        self.skipped = 0  # lines that were not incidents

    # -- position ---------------------------------------------------------------------------
    def arm(self) -> None:
        """Daemon: where the cursor says (start of the file without one); transaction: the end."""
        st = _stat(self.path)
        if self.cursor_path is None:
            self._ino, self._off = (st.st_ino, st.st_size) if st else (None, 0)
            return
        self._ino, self._off = _read_cursor(self.cursor_path)
        if self._ino is None and _stat(self.cursor_path) is not None:
            log.error("kernel canary cursor %s unreadable or damaged: the log is read from its "
                      "start (incidents already journalled are recognised by id)", self.cursor_path)
        if st is None or st.st_ino != self._ino or st.st_size < self._off:
            self._ino, self._off = (st.st_ino if st else None), 0  # replaced: from its start

    def _save(self) -> None:
        if self.cursor_path is None or self._ino is None:
            return
        tmp = self.cursor_path.with_name(CURSOR_NAME + ".tmp")
        try:
            try:  # whatever is there (a leftover, a FIFO planted to block us) goes
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            # a fresh file (O_EXCL: nothing swapped in since), never waited on (O_NONBLOCK)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
                         | os.O_NONBLOCK, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump({"ino": self._ino, "offset": self._off}, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.cursor_path)
        except OSError as e:  # lines read again after a restart are de-duplicated by id
            log.error("kernel canary cursor %s not written: %s", self.cursor_path, e)

    # -- reading ----------------------------------------------------------------------------
    def poll(self) -> list[Incident]:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except FileNotFoundError:
            return []
        try:
            st = os.fstat(fd)
            if not _regular(st.st_mode):
                raise OSError(f"{self.path}: not a regular file")
            if st.st_ino != self._ino or st.st_size < self._off:
                self._ino, self._off = st.st_ino, 0  # a new or truncated log: from its start
            data = os.pread(fd, MAX_READ, self._off)
        finally:
            os.close(fd)
        out: list[Incident] = []
        start = 0
        while True:
            nl = data.find(b"\n", start)
            if nl < 0:
                if len(data) - start > MAX_LINE:  # a line too long to ever be one: skipped
                    self._bad("a line over %d bytes" % MAX_LINE)
                    start = len(data)
                break
            line = data[start:nl]
            start = nl + 1
            if len(line) > MAX_LINE:
                self._bad("a line over %d bytes" % MAX_LINE)
                continue
            inc = self._incident(line)
            if inc is not None:
                out.append(inc)
        if start:
            self._off += start
            self._save()
        return out

    def _bad(self, why: str) -> None:
        self.skipped += 1
        if time.monotonic() - self._bad_said > 60:  # said once a minute
            self._bad_said = time.monotonic()
            log.error("kernel canary log %s: %s, skipped (%d lines skipped so far)", self.path,
                      why, self.skipped)

    def _incident(self, raw: bytes) -> Optional[Incident]:
        from safety.inputs import parse_json

        try:  # nesting bounded before the parser recurses into it
            ln = CanaryLine.model_validate(parse_json(raw.decode(), "line", ValueError))
        except (ValueError, ValidationError, RecursionError) as e:
            self._bad(f"not an incident line ({str(e).splitlines()[0][:200]})")
            return None
        sha = ln.source_sha256 if _SHA.match(ln.source_sha256) else ""
        err = "" if ln.max_abs_error is None else f"max abs error {ln.max_abs_error:.3g}"
        if ln.nonfinite:
            err += (", " if err else "") + f"{ln.nonfinite} values not finite"
        what = f"{ln.family} {ln.variant}" + (f" (src:{sha[:12]})" if sha else "")
        detail = (f"kernel canary: {what} computed wrong at shape {ln.shape} {ln.dtype}"
                  + (f" ({err})" if err else "") + f"; its entry removed, the calls run the "
                  f"fallback: {ln.detail[:500]}")
        data = {"id": ln.id, "family": ln.family, "variant": ln.variant, "source_sha256": sha,
                "config": ln.config, "shape": ln.shape, "dtype": ln.dtype,
                "max_abs_error": ln.max_abs_error, "nonfinite": ln.nonfinite,
                "removed_entries": ln.removed_entries, "quarantined": ln.quarantined,
                "pid": ln.pid}
        if sha:
            data["store_quarantine"] = self._quarantine(sha, ln, data)
        return self.incident(TYPE, "fatal", detail, time=min(ln.time, time.time()), data=data)

    def _quarantine(self, sha: str, ln: CanaryLine, data: dict[str, Any]) -> str:
        """Quarantine the source in this host's store unless it already is (the model process
        did, or it is not in this store). Only the record is written: nothing is loaded."""
        from kernelsearch.store import SourceStore, StoreError

        if not (self.store / f"{sha}.json").is_file():
            return "not in this host's store"
        try:
            st = SourceStore(self.store)
            if st.record(sha).quarantined:
                return "quarantined"
            st.quarantine(sha, f"kernel canary (pid {ln.pid}): {ln.detail[:1000]}", data)
            return "quarantined by the daemon"
        except (OSError, StoreError) as e:
            log.error("kernel canary: src:%s not quarantined in %s: %s", sha[:12], self.store, e)
            return f"not quarantined: {e}"


def _stat(p: Path) -> Optional[os.stat_result]:
    try:
        return os.stat(p, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _regular(mode: int) -> bool:
    import stat

    return stat.S_ISREG(mode)


def _read_cursor(p: Path) -> tuple[Optional[int], int]:
    """(inode, offset) from the cursor; (None, 0) when it is missing, not a small regular file
    (a FIFO is refused, never waited on) or not the two non-negative integers we write."""
    from safety.errors import InputError
    from safety.inputs import load_json

    try:
        d = load_json(p, limit=4096, follow_symlinks=False)
    except InputError:
        return None, 0
    if not isinstance(d, dict):
        return None, 0
    ino, off = d.get("ino"), d.get("offset")
    if not all(type(v) is int and 0 <= v < 1 << 63 for v in (ino, off)):
        return None, 0
    return ino, off


def quarantine_caught(store_dir: Path, shas: Collection[str], done: set[str],
                      incidents: Any) -> list[str]:
    """Quarantine in `store_dir` the stored sources a model process's canary caught computing
    wrong (the process quarantined its own copy only: tuner.workloads.model_process). Only
    `shas` (the sources of the table installed there) count: a reply cannot quarantine anything
    else; those in `done` already were (added to it). Returns the digests quarantined now."""
    from kernelsearch.store import SourceStore, StoreError

    out: list[str] = []
    if not isinstance(incidents, list):
        return out
    store = SourceStore(store_dir)
    for inc in incidents:
        sha = inc.get("source_sha256") if isinstance(inc, dict) else None
        if sha not in shas or sha in done:
            continue
        try:
            store.quarantine(sha, f"kernel canary (model process): "
                                  f"{str(inc.get('detail', ''))[:1000]}",
                             {k: str(inc.get(k, ""))[:300] for k in
                              ("kind", "family", "variant", "shape", "at")})
        except (OSError, StoreError):
            continue
        done.add(sha)
        out.append(sha)
    return out
