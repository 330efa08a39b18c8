"""Kernel sources as artifacts: a candidate that passed the judge, stored content-addressed.

    store = SourceStore(STATE_DIR / "kernels" / "sources")
    rec = store.put("rmsnorm", source, config, verdict, checked=[...], timed=[...])
    table entry: {"variant": f"src:{rec.sha256}", "config": {...}, ...}
    src = store.source(rec.sha256)          # re-hashed on every read: a changed file is refused

Layout: `<root>/<sha256>.py` (the source, byte for byte) and `<root>/<sha256>.json` (the record:
family, config, the judge's verdict, the shapes it was checked and timed on, where it was
judged: GPU name, driver, torch and triton versions, and every later re-judgement). Files are
written atomically (temporary file in the same folder, fsync, rename), never through a symlink
(O_NOFOLLOW on every open, the root itself must not be one), owner-only (0700 / 0600) when the
process is root. Plain data and the standard library: the store runs on bare GPU hosts."""
from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import stat
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

SHA_RE = re.compile(r"[0-9a-f]{64}\Z")
# what a recorded judgement depends on: a change of any of these re-judges before use
ENV_KEYS = ("gpu", "driver", "triton")


class StoreError(ValueError):
    """A stored kernel cannot be used: unknown digest, digest mismatch, unsafe file."""


def digest(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()


def check_sha(sha: str) -> str:
    if not isinstance(sha, str) or not SHA_RE.match(sha):
        raise StoreError(f"not a SHA-256 digest (64 lowercase hex digits): {sha!r}")
    return sha


def _driver_version() -> str:
    """The NVIDIA driver version, read-only: NVML if importable, else the kernel module."""
    try:
        import pynvml  # nvidia-ml-py: optional on a GPU host

        pynvml.nvmlInit()
        try:
            v = pynvml.nvmlSystemGetDriverVersion()
            return v.decode() if isinstance(v, bytes) else str(v)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no NVML here: try the module's own file
        pass
    for p in ("/sys/module/nvidia/version", "/proc/driver/nvidia/version"):
        try:
            text = Path(p).read_text()
        except OSError:
            continue
        m = re.search(r"\d+\.\d+(\.\d+)?", text)
        if m:
            return m.group(0)
    return ""


def environment(device: str = "cuda") -> dict[str, str]:
    """Where a kernel runs: GPU name, driver, torch and triton versions (CPU: the interpreter)."""
    import torch
    import triton

    if device == "cuda" and torch.cuda.is_available():
        gpu, driver = torch.cuda.get_device_name(0), _driver_version()
    else:
        gpu, driver = "cpu (triton interpreter)", ""
    return {"gpu": str(gpu), "driver": str(driver), "torch": str(torch.__version__),
            "triton": str(triton.__version__)}


def env_differs(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """The ENV_KEYS on which two environments differ (empty: a judgement carries over)."""
    return [k for k in ENV_KEYS if str(a.get(k, "")) != str(b.get(k, ""))]


_FIELD_TYPES: dict[str, type] = {"sha256": str, "family": str, "config": dict, "verdict": dict,
                                 "checked": list, "timed": list, "env": dict, "stored_at": str,
                                 "origin": dict, "judgements": list, "imported_at": str,
                                 "quarantined": dict}
MAX_RECORD = 4 << 20  # bytes: a record is a few KiB; anything near this is not one


@dataclass
class Record:
    sha256: str
    family: str
    config: dict[str, Any]
    verdict: dict[str, Any]  # the judge's Verdict.to_dict()
    checked: list[list[int]]  # shapes the correctness stage ran
    timed: list[list[int]]  # shapes the timing stage ran
    env: dict[str, str]  # where it was judged (environment())
    stored_at: str = ""
    origin: dict[str, Any] = field(default_factory=dict)  # run, trial, proposer, model, ideas
    judgements: list[dict[str, Any]] = field(default_factory=list)  # this host's re-judgements
    # set when the record came in a bundle (a profile): its verdict and env are then another
    # host's claims, provenance only; only this host's own judgements count
    imported_at: str = ""
    # set when the kernel canary saw it compute wrong in use: never installed or offered again
    quarantined: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Any, where: str = "record") -> "Record":
        if not isinstance(d, dict):
            raise StoreError(f"{where}: expected a mapping")
        missing = [k for k in ("sha256", "family", "verdict", "env") if k not in d]
        if missing:
            raise StoreError(f"{where}: missing {', '.join(missing)}")
        for k, t in _FIELD_TYPES.items():
            if k in d and not isinstance(d[k], t):
                raise StoreError(f"{where}: field {k}: expected a {t.__name__}, got "
                                 f"{type(d[k]).__name__}")
        if not all(isinstance(j, dict) and isinstance(j.get("env", {}), dict)
                   for j in d.get("judgements", [])):
            raise StoreError(f"{where}: field judgements: expected a list of mappings")
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})

    def judged_on(self, env: dict[str, Any]) -> bool:
        """Judged (accepted) on this environment by this host: at store time (a record this
        host's judge wrote, not an imported one) or by a later re-judgement here."""
        own = not self.imported_at and self.verdict.get("verdict") == "accepted"
        return (own and not env_differs(self.env, env)) or any(
            j.get("verdict") == "accepted" and not env_differs(j.get("env", {}), env)
            for j in self.judgements)


def _root_only() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def _write_at(dfd: int, name: str, data: bytes) -> None:
    """Atomic write of `name` in the open directory `dfd` (closed here): a fresh temporary file
    (O_EXCL, O_NOFOLLOW: never through a planted link), fsync, rename over the name (a symlink
    there is replaced, its target untouched), fsync of the directory."""
    tmp = f".{name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                     0o600 if _root_only() else 0o644, dir_fd=dfd)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        os.fsync(dfd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dfd)
        except OSError:
            pass
        raise
    finally:
        os.close(dfd)


def atomic_write(path: Union[str, Path], data: bytes) -> None:
    """`_write_at` for a path whose folder the caller chose (created if missing)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    _write_at(os.open(p.parent, os.O_RDONLY | os.O_DIRECTORY), p.name, data)


class SourceStore:
    """Content-addressed kernel sources under one folder (see the module docstring)."""

    def __init__(self, root: Union[str, Path]):
        self.root = Path(root)

    # -- files -----------------------------------------------------------------------------------
    def _dir_fd(self, create: bool) -> int:
        if create and not os.path.lexists(self.root):
            os.makedirs(self.root, mode=0o700 if _root_only() else 0o755, exist_ok=True)
        try:
            st = os.lstat(self.root)
        except FileNotFoundError:
            raise StoreError(f"{self.root}: no kernel store here") from None
        if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
            raise StoreError(f"{self.root}: not a plain directory (a symlink is never followed)")
        if _root_only() and (st.st_uid != 0 or st.st_mode & 0o022):
            raise StoreError(f"{self.root}: must be owned by root and not group/world-writable")
        return os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)

    def _write(self, name: str, data: bytes) -> None:
        _write_at(self._dir_fd(create=True), name, data)

    def _read(self, name: str) -> bytes:
        dfd = self._dir_fd(create=False)
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dfd)
        except FileNotFoundError:
            raise StoreError(f"{self.root / name}: not in the kernel store") from None
        except OSError as e:  # ELOOP: a symlink
            raise StoreError(f"{self.root / name}: cannot open ({e.strerror})") from None
        finally:
            os.close(dfd)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise StoreError(f"{self.root / name}: not a regular file")
            chunks = []
            while chunk := os.read(fd, 1 << 20):
                chunks.append(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)

    # -- API -------------------------------------------------------------------------------------
    def put(self, family: str, source: str, config: Optional[dict] = None,
            verdict: Optional[dict] = None, checked: Optional[list] = None,
            timed: Optional[list] = None, env: Optional[dict] = None,
            origin: Optional[dict] = None, device: str = "cuda") -> Record:
        """Store an accepted source; storing the same source again keeps the first record (its
        provenance) and returns it."""
        verdict = dict(verdict or {})
        if verdict.get("verdict") != "accepted":
            raise StoreError("only a source the judge accepted is stored "
                             f"(verdict {verdict.get('verdict')!r}, code {verdict.get('code')!r})")
        sha = digest(source)
        if self.has(sha):
            return self.record(sha)
        rec = Record(sha256=sha, family=family, config=dict(config or {}), verdict=verdict,
                     checked=[list(s) for s in checked or []],
                     timed=[list(s) for s in timed or []],
                     env=dict(env) if env is not None else environment(device),
                     stored_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                     origin=dict(origin or {}))
        self._write(f"{sha}.py", source.encode())  # the source first: a record names a file
        self._write(f"{sha}.json", (json.dumps(rec.to_dict(), indent=1, default=str) + "\n").encode())
        return rec

    def has(self, sha: str) -> bool:
        check_sha(sha)
        return (self.root / f"{sha}.json").is_file() and not (self.root / f"{sha}.json").is_symlink()

    def source(self, sha: str) -> str:
        """The source text, re-hashed: a file whose content no longer has its name is refused."""
        check_sha(sha)
        data = self._read(f"{sha}.py")
        got = hashlib.sha256(data).hexdigest()
        if got != sha:
            raise StoreError(f"{self.root / (sha + '.py')}: digest mismatch (file hashes to "
                             f"{got[:12]}..., its name says {sha[:12]}...): refused")
        return data.decode()

    def record(self, sha: str) -> Record:
        check_sha(sha)
        where = self.root / f"{sha}.json"
        data = self._read(f"{sha}.json")
        if len(data) > MAX_RECORD:
            raise StoreError(f"{where}: {len(data)} bytes, not a record (at most {MAX_RECORD})")
        try:
            d = json.loads(data)
        except json.JSONDecodeError as e:
            raise StoreError(f"{where}: not JSON ({e.msg})") from None
        except RecursionError:
            raise StoreError(f"{where}: nested too deeply to be a record") from None
        except UnicodeDecodeError:
            raise StoreError(f"{where}: not UTF-8 text") from None
        rec = Record.from_dict(d, str(where))
        if rec.sha256 != sha:
            raise StoreError(f"{self.root / (sha + '.json')}: record names {rec.sha256[:12]}...")
        return rec

    def scan(self) -> tuple[list[Record], list[tuple[str, str]]]:
        """(every stored record that reads, oldest first; (file, why) for each that does not).
        One bad record never hides the others; an unsafe store (a symlink, not root's, group-
        or world-writable when root) raises StoreError instead of looking empty."""
        out: list[Record] = []
        bad: list[tuple[str, str]] = []
        if not os.path.lexists(self.root):
            return out, bad
        os.close(self._dir_fd(create=False))  # raises for an unsafe store
        for p in sorted(self.root.glob("*.json")):
            if SHA_RE.match(p.stem):
                try:
                    out.append(self.record(p.stem))
                except StoreError as e:
                    bad.append((str(p), str(e)))
        return sorted(out, key=lambda r: r.stored_at), bad

    def list(self) -> list[Record]:
        """Every stored record that reads, oldest first (`scan` also names the others)."""
        return self.scan()[0]

    def quarantine(self, sha: str, why: str, incident: Optional[dict] = None) -> Record:
        """Mark a source as computing wrong in use (the kernel canary): dispatch never installs
        it again and no search offers it."""
        rec = self.record(sha)
        rec.quarantined = {"at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                           "why": why[:2000], **({"incident": incident} if incident else {})}
        self._write(f"{sha}.json", (json.dumps(rec.to_dict(), indent=1, default=str) + "\n").encode())
        return rec

    def add_judgement(self, sha: str, verdict: dict[str, Any], env: dict[str, str]) -> Record:
        """Record a re-judgement (another GPU, driver or triton) so the next process can reuse it."""
        rec = self.record(sha)
        rec.judgements.append({"env": dict(env), "verdict": verdict.get("verdict"),
                               "code": verdict.get("code"), "rule": verdict.get("rule", ""),
                               "checks": len(verdict.get("checks", [])),
                               "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
        self._write(f"{sha}.json", (json.dumps(rec.to_dict(), indent=1, default=str) + "\n").encode())
        return rec

    # -- bundles (host profiles carry the sources their tables name) ---------------------------
    def export(self, sha: str) -> dict[str, Any]:
        return {"source": self.source(sha), "record": self.record(sha).to_dict()}

    def import_bundle(self, sha: str, bundle: Any, where: str = "kernel_sources",
                      judgement: Optional[tuple[dict, dict]] = None) -> Record:
        """Verify a bundled source against its digest and store it. Its record travels with it
        as provenance only (`imported_at` set; the judgements it claims are kept under
        origin.claimed_judgements and count for nothing): `judgement`, (verdict, env) of this
        host's own judge, is what lets dispatch run it. Raises StoreError on any mismatch."""
        check_sha(sha)
        if not isinstance(bundle, dict) or not isinstance(bundle.get("source"), str):
            raise StoreError(f"{where}.{sha[:12]}: expected {{source: TEXT, record: {{...}}}}")
        got = digest(bundle["source"])
        if got != sha:
            raise StoreError(f"{where}.{sha[:12]}: digest mismatch (the bundled source hashes "
                             f"to {got[:12]}...): refused")
        rec = Record.from_dict(bundle.get("record"), f"{where}.{sha[:12]}.record")
        if rec.sha256 != sha:
            raise StoreError(f"{where}.{sha[:12]}.record: names {rec.sha256[:12]}...")
        if self.has(sha):
            self.source(sha)  # the local copy must still verify
            rec = self.record(sha)
        else:
            rec.origin = dict(rec.origin, claimed_judgements=rec.judgements[:20])
            rec.judgements, rec.quarantined = [], {}
            rec.imported_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            self._write(f"{sha}.py", bundle["source"].encode())
            self._write(f"{sha}.json",
                        (json.dumps(rec.to_dict(), indent=1, default=str) + "\n").encode())
        if judgement is not None and not rec.judged_on(judgement[1]):
            rec = self.add_judgement(sha, *judgement)
        return rec


def default_root() -> Path:
    """Where dispatch looks when no store is given: KERNELSEARCH_SOURCES, else the metaltune
    state dir's `kernels/sources` (METALTUNE_STATE_DIR, default /var/lib/metaltune)."""
    env = os.environ.get("KERNELSEARCH_SOURCES")
    if env:
        return Path(env)
    return Path(os.environ.get("METALTUNE_STATE_DIR") or "/var/lib/metaltune") / "kernels" / "sources"
