"""`fleet apply` with a boot-time setting over real sshd hosts in network namespaces, each running
metaltune on its own simulated host: the drain hook runs first, each host tries the value by a
one-shot boot, the controller waits for that host's gate after the reboot, and the next wave starts
only after it. Each host's reboot and its gate unit are played by the test (a thread that reboots
the simulated host when its systemctl was asked to, then runs `boot gate`, as
metaltune-boot-gate.service would)."""
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from tests.boot.conftest import POLICY
from tests.fleet.test_rollout_ssh import ROOT, fleet, setup_fleet

pytestmark = [pytest.mark.peers, pytest.mark.skipif(
    __import__("shutil").which("grub-editenv") is None, reason="no grub-editenv")]


class Boots(threading.Thread):
    """Reboots a host's simulated machine once it asked for it, then runs its gate."""

    def __init__(self, dirs, pol):
        super().__init__(daemon=True)
        self.dirs, self.pol, self.stop, self.order = dirs, pol, threading.Event(), []

    def run(self):
        while not self.stop.is_set():
            for n, d in self.dirs.items():
                if (d / "sim/boot/reboot-requested").exists():
                    env = {**os.environ, "METALTUNE_BACKEND": "sim", "METALTUNE_SIM_ROOT": str(d / "sim"),
                           "METALTUNE_STATE_DIR": str(d / "state"), "METALTUNE_RUN_DIR": str(d / "run"),
                           "METALTUNE_NO_DAEMON": "1", "METALTUNE_POLICY": str(self.pol)}
                    for args in (["sim", "reboot", str(d / "sim")], ["boot", "gate", "--probation", "0"]):
                        subprocess.run([sys.executable, "-m", "tuner", *args], env=env, cwd=ROOT,
                                       capture_output=True, timeout=120)
                    self.order.append((n, time.monotonic()))
            time.sleep(0.2)


def test_boot_time_setting_rolls_out_host_by_host_behind_each_gate(netns_lab, tmp_path):
    pol = tmp_path / "policy.yaml"
    pol.write_text(POLICY)
    inv, prof, dirs = setup_fleet(netns_lab, tmp_path, ["b1", "b2"], knobs="boot.cmdline.iommu: pt")
    doc = yaml.safe_load(inv.read_text())
    for h in doc["hosts"].values():  # each host's policy allows boot-time values
        h["env"]["METALTUNE_POLICY"] = str(pol)
    inv.write_text(yaml.safe_dump(doc))
    log = tmp_path / "hooks.log"
    boots = Boots(dirs, pol)
    boots.start()
    try:
        r = fleet(netns_lab, tmp_path, "apply", str(prof), "--inventory", str(inv), "--canary", "1",
                  "--probation", "1", "--drain-cmd", f"echo drain {{host}} >> {log}",
                  "--undrain-cmd", f"echo undrain {{host}} >> {log}", "--gate-timeout", "120",
                  "--json")
    finally:
        boots.stop.set()
        boots.join(5)
    assert r.returncode == 0, r.stdout + r.stderr
    assert [n for n, _ in boots.order] == ["b1", "b2"]  # the canary's gate before the next wave
    assert log.read_text().split("\n")[:4] == ["drain b1", "undrain b1", "drain b2", "undrain b2"]
    for d in dirs.values():
        assert "iommu=pt" in (d / "sim/proc/cmdline").read_text()


def test_a_canary_whose_trial_loses_halts_the_rollout_and_later_hosts_are_untouched(netns_lab,
                                                                                   tmp_path):
    pol = tmp_path / "policy.yaml"
    pol.write_text(POLICY)
    inv, prof, dirs = setup_fleet(netns_lab, tmp_path, ["c1", "c2"],
                                  knobs='boot.cmdline.intel_iommu: "on"')
    doc = yaml.safe_load(inv.read_text())
    for h in doc["hosts"].values():
        h["env"]["METALTUNE_POLICY"] = str(pol)
    inv.write_text(yaml.safe_dump(doc))
    log = tmp_path / "hooks.log"
    base = (dirs["c2"] / "sim/proc/cmdline").read_text()
    boots = Boots(dirs, pol)
    boots.start()
    try:
        r = fleet(netns_lab, tmp_path, "apply", str(prof), "--inventory", str(inv), "--canary", "1",
                  "--probation", "1", "--drain-cmd", f"echo drain {{host}} >> {log}",
                  "--gate-timeout", "120", "--json")
    finally:
        boots.stop.set()
        boots.join(5)
    assert r.returncode != 0
    assert "boot trial #1: rolled_back" in r.stdout + r.stderr
    assert log.read_text().split() == ["drain", "c1"]  # c1 stays drained; c2 never drained
    assert "intel_iommu" not in (dirs["c1"] / "sim/proc/cmdline").read_text()
    assert (dirs["c2"] / "sim/proc/cmdline").read_text() == base
