"""A simulated host with a boot loader, driven by `metaltune` in-process (boot try, sim reboot,
boot gate), with a policy that allows boot-time changes."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.simhelpers import run_cli

needs_grub = pytest.mark.skipif(shutil.which("grub-editenv") is None,
                                reason="grub-editenv missing (apt-get install grub-common)")

POLICY = """version: 1
description: boot trials allowed (tests)
rules:
  - knob: "boot.cmdline.*"
    allow_reboot_effect: true
    allow_null: true
  - knob: "driver.nvidia.*"
    allow_reboot_effect: true
  - knob: "bios.*"
    allow_reboot_effect: true
"""


class Boot:
    def __init__(self, tmp: Path, capsys, monkeypatch, loader: str = "grub"):
        self.root, self.state, self.capsys = tmp / "sim", tmp / "state", capsys
        self.policy = tmp / "policy.yaml"
        self.policy.write_text(POLICY)
        for k, v in {"METALTUNE_BACKEND": "sim", "METALTUNE_SIM_ROOT": str(self.root),
                     "METALTUNE_STATE_DIR": str(self.state), "METALTUNE_RUN_DIR": str(tmp / "run"),
                     "METALTUNE_NO_DAEMON": "1"}.items():
            monkeypatch.setenv(k, v)
        rc, _, err = self("sim", "init", str(self.root), "--boot-loader", loader)
        assert rc == 0, err

    def __call__(self, *args: str) -> tuple[int, str, str]:
        return run_cli(self.capsys, *args)

    def json(self, *args: str) -> dict:
        rc, out, err = self(*args, "--json")
        assert rc == 0, err
        return json.loads(out)

    def try_(self, *changes: str, expect: int = 0) -> tuple[int, str, str]:
        r = self("boot", "try", *changes, "--policy", str(self.policy))
        assert r[0] == expect, r
        return r

    def reboot(self, *flags: str) -> dict:
        return self.json("sim", "reboot", str(self.root), *flags)

    def gate(self) -> dict:
        return self.json("boot", "gate", "--probation", "0.2")

    def cmdline(self) -> str:
        return (self.root / "proc/cmdline").read_text()

    def status(self) -> dict:
        return self.json("boot", "status")

    def reboot_requested(self) -> bool:
        return (self.root / "boot/reboot-requested").exists()


@pytest.fixture
def boot(tmp_path, capsys, monkeypatch):
    return Boot(tmp_path, capsys, monkeypatch)


@pytest.fixture
def bls_boot(tmp_path, capsys, monkeypatch):
    return Boot(tmp_path, capsys, monkeypatch, loader="systemd-boot")
