"""`search host` with boot-time knobs: left out (and said) without a reboot budget; with
`--reboots N`, one trial boot per candidate, each gated after its boot, the next armed by the
gate, every reboot counted (a demotion's way back too), what the budget left untried said."""
from __future__ import annotations

from tests.boot.conftest import needs_grub
from tuner.boot.grub import Grub
from tuner.host import Host

pytestmark = needs_grub


def test_boot_knobs_need_a_reboot_budget(boot):
    rc, _, err = boot("search", "host", "--knob", "boot.cmdline.iommu", "--policy",
                      str(boot.policy))
    assert rc == 2 and "boot.cmdline.iommu take effect at boot: --reboots N" in err


def test_one_reboot_per_candidate_until_the_budget_is_spent(boot):
    res = boot.json("search", "host", "--knob", "boot.cmdline.iommu", "--reboots", "2",
                    "--policy", str(boot.policy))
    b = res["boot_search"]
    assert b["boot_search"] == "armed" and b["candidate"] == {"boot.cmdline.iommu": "pt"}
    assert b["reboots_left"] == 1 and boot.reboot_requested()
    boot.reboot()
    g = boot.gate()
    assert g["state"] == "promoted"
    assert g["boot_search"]["candidate"] == {"boot.cmdline.iommu": "on"}  # the next, armed
    assert g["boot_search"]["reboots_left"] == 0
    boot.reboot()
    g = boot.gate()
    assert g["state"] == "demoted" and "boot_search" not in g  # decided after the way back
    boot.reboot()
    g = boot.gate()
    assert g["state"] == "rolled_back" and g["boot_search"]["boot_search"] == "done"
    assert g["boot_search"]["untried"] == [{"boot.cmdline.iommu": "off"}]
    assert "3 reboots" in g["boot_search"]["reason"] and "budget (2) spent" in g["boot_search"]["reason"]
    assert Grub(Host("sim", boot.root)).default() == "metaltune-trial-1"
    assert "iommu=pt" in boot.reboot()["cmdline"]  # the promoted one stays
    assert boot.gate()["trial"] is None and not (boot.state / "boot-search.json").exists()
