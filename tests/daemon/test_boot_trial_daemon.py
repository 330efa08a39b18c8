"""A boot trial across a reboot with the real daemon: `boot try` through its socket asks for the
reboot (the simulated host's systemctl), the daemon is stopped, the host reboots into the trial
entry, and the daemon started again decides the trial at start, before it reports READY."""
from __future__ import annotations

import json
import shutil

import pytest

from tests.boot.conftest import POLICY
from tests.daemon.conftest import write_config

pytestmark = pytest.mark.skipif(shutil.which("grub-editenv") is None, reason="no grub-editenv")


def test_trial_is_armed_by_the_daemon_and_gated_by_the_next_start(tmp_path, sim_host, start_daemon):
    from tuner.boot.grub import Grub
    from tuner.host import Host
    from tuner.sim import boot as simboot

    pol = tmp_path / "policy.yaml"
    pol.write_text(POLICY)
    cfg = write_config(tmp_path / "metaltune.toml", sim_host, tmp_path, boot_gate_probation_s=0.2)
    d = start_daemon(cfg)
    d.wait_ready()
    r = d.cli("boot", "try", "boot.cmdline.iommu=pt", "--policy", str(pol), "--repeats", "3",
              "--json")
    assert json.loads(r.stdout)["result"] == "rebooting into the trial entry"
    assert (sim_host / "boot/reboot-requested").exists()  # the daemon ran systemctl reboot
    assert Grub(Host("sim", sim_host)).armed() == "metaltune-trial-1"
    assert d.stop() == 0
    simboot.reboot(sim_host)
    d2 = start_daemon(cfg)
    d2.wait_ready()
    assert "state=promoted" in d2.wait_log("boot.gate")
    st = json.loads(d2.cli("boot", "status", "--json").stdout)
    assert st["trials"][0]["state"] == "promoted" and st["loader"]["default"] == "metaltune-trial-1"
    assert d2.stop() == 0
