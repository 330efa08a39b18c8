"""File-backed knobs for the safety tests: each value is a JSON file under a folder, so its state
outlives any process (like the simulated host). They satisfy safety.protocol.SafeKnob."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


class Domain:
    def __init__(self, lo: int, hi: int):
        self.lo, self.hi = lo, hi

    def validate_value(self, v: Any) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or not self.lo <= v <= self.hi:
            raise ValueError(f"{v!r} outside [{self.lo}, {self.hi}]")
        return v

    def model_dump(self) -> dict[str, Any]:
        return {"min": self.lo, "max": self.hi}


class FileKnob:
    effect = "now"

    def __init__(self, root: str | os.PathLike[str], name: str, lo: int = 0, hi: int = 1000,
                 default: int | None = None, fail_write: bool = False):
        self.root, self.name = Path(root), name
        self.dom, self._default, self.fail_write = Domain(lo, hi), default, fail_write
        self.writes = 0

    @property
    def file(self) -> Path:
        return self.root / f"{self.name}.json"

    def read(self) -> Any:
        return json.loads(self.file.read_text())

    def _write(self, v: Any) -> None:
        tmp = self.file.with_suffix(".tmp")
        tmp.write_text(json.dumps(v))
        os.replace(tmp, self.file)
        self.writes += 1

    def validate(self, v: Any) -> Any:
        return self.dom.validate_value(v)

    def apply(self, v: Any) -> Any:
        v = self.validate(v)
        bad, self.fail_write = self.fail_write, False  # one bad write
        self._write(v if not bad else v + 1)
        got = self.read()
        if got != v:
            raise RuntimeError(f"{self.name}: wrote {v} read back {got}")
        return got

    def limits(self) -> Domain:
        return self.dom

    def identity(self) -> str:
        return f"file:{self.root.name}:{self.name}"

    def default(self) -> Any:
        return self._default


class PendingFileKnob(FileKnob):
    """Takes effect on reboot: apply writes a pending file; read() is the active value."""

    effect = "reboot"

    @property
    def pfile(self) -> Path:
        return self.root / f"{self.name}.pending.json"

    def apply(self, v: Any) -> Any:
        v = self.validate(v)
        self.pfile.write_text(json.dumps(v))
        return self.pending()

    def pending(self) -> Any:
        return json.loads(self.pfile.read_text()) if self.pfile.exists() else None

    def clear_pending(self) -> None:
        self.pfile.unlink(missing_ok=True)


def init(root: str | os.PathLike[str], values: dict[str, int]) -> None:
    Path(root).mkdir(parents=True, exist_ok=True)
    for n, v in values.items():
        (Path(root) / f"{n}.json").write_text(json.dumps(v))


def make(root: str, spec: dict[str, list[int]] | None = None) -> dict[str, FileKnob]:
    """Knob factory (also used by spawned watchdogs: `_knobs:make`)."""
    spec = spec or {"gpu0.power_limit_w": [100, 700, 700], "gpu0.locked_clocks_mhz": [0, 2000, 0],
                    "cpu.governor_level": [0, 5, 0]}
    out: dict[str, FileKnob] = {n: FileKnob(root, n, lo, hi, dflt) for n, (lo, hi, dflt) in spec.items()}
    out["bios.Profile"] = PendingFileKnob(root, "bios.Profile", 0, 9, 0)
    return out


def snapshot(root: str | os.PathLike[str]) -> dict[str, Any]:
    return {p.name: p.read_text() for p in sorted(Path(root).glob("*.json"))}
