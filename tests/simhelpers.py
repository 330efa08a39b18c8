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


class SimCli:
    """`metaltune` as a user runs it (a subprocess) against a simulated host made by
    `metaltune sim init DIR --sku SKU`, with its own state and run dirs."""

    def __init__(self, tmp: Path, sku: str = "h200", *extra: str):
        import os
        import sys

        self.root, self.state = tmp / "sim", tmp / "state"
        self.python = sys.executable
        self.env = {**os.environ, "PYTHONPATH": str(REPO), "METALTUNE_BACKEND": "sim",
                    "METALTUNE_SIM_ROOT": str(self.root), "METALTUNE_STATE_DIR": str(self.state),
                    "METALTUNE_RUN_DIR": str(tmp / "run"), "COLUMNS": "80"}
        self.env.pop("METALTUNE_NO_DAEMON", None)
        r = self("sim", "init", str(self.root), "--sku", sku, *extra)
        assert r.returncode == 0, r.stderr

    def cmd(self, *args: str) -> list[str]:
        return [self.python, "-m", "tuner", *args]

    def __call__(self, *args: str, timeout: float = 120, **kw):
        import subprocess

        return subprocess.run(self.cmd(*args), cwd=REPO, env={**self.env, **kw.pop("env", {})},
                              capture_output=True, text=True, timeout=timeout, **kw)

    def popen(self, *args: str):
        import subprocess

        return subprocess.Popen(self.cmd(*args), cwd=REPO, env=self.env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
