"""Helpers shared by tests that drive the CLI against simulated hosts."""
from __future__ import annotations

import hashlib
from pathlib import Path


def host_digest(root: Path) -> str:
    """Everything a knob could have written on a simulated host (device state, sysfs, procfs,
    the BMC double); lock files excluded. Equal digests: nothing changed."""
    h = hashlib.sha256()
    for p in sorted(Path(root).rglob("*")):
        if p.is_file() and p.name != "lock":
            h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    """Run `metaltune ARGS` in-process; returns (exit code, stdout, stderr)."""
    from tuner.cli import main

    rc = main(list(args))
    out = capsys.readouterr()
    return rc, out.out, out.err


REPO = Path(__file__).resolve().parents[1]
PERMISSIVE = str(REPO / "safety/policies/permissive.yaml")
