"""The trial-boot path end to end on a simulated host: a winner promoted, a loser demoted and
rebooted into the old default, a panic and a hang ending on the old default, refusals that change
nothing. Nothing is ever the default boot entry unless its gate passed."""
from __future__ import annotations

from tests.boot.conftest import needs_grub
from tests.simhelpers import host_digest
from tuner.boot.grub import Grub
from tuner.host import Host

pytestmark = needs_grub


def default_of(b) -> str | None:
    return Grub(Host("sim", b.root)).default()


def test_a_winning_candidate_is_promoted_and_stays_after_the_next_boot(boot):
    boot.try_("boot.cmdline.iommu=pt")
    assert boot.reboot_requested() and default_of(boot) is None
    boot.reboot()
    res = boot.gate()
    assert res["state"] == "promoted", res
    t = boot.status()["trials"][0]
    bench = t["result"]["benchmark"]
    assert bench["after"] > bench["baseline"] * 1.03 and bench["reason"] == "improved"
    assert default_of(boot) == "metaltune-trial-1"
    assert "iommu=pt" in boot.reboot()["cmdline"]
    assert boot.gate()["trial"] is None  # nothing open any more


def test_a_losing_candidate_is_demoted_quarantined_and_the_host_reboots_to_the_old_default(boot):
    base = boot.cmdline().strip()
    boot.try_("boot.cmdline.intel_iommu=on")
    boot.reboot()
    assert "intel_iommu=on" in boot.cmdline()
    res = boot.gate()
    assert res["state"] == "demoted" and "lost the benchmark" in res["reason"], res
    assert boot.reboot_requested() and default_of(boot) is None
    assert boot.reboot()["cmdline"] == base
    assert boot.gate()["state"] == "rolled_back"
    q = boot.json("quarantine", "list")
    assert any("intel_iommu" in str(e) for e in q["quarantine"]), q
    rc, _, err = boot.try_("boot.cmdline.intel_iommu=on", expect=1)
    assert "quarantined" in err


def test_a_panic_and_a_hang_end_on_the_old_default_and_are_journalled_lost(boot):
    base = boot.cmdline().strip()
    for n, flag in ((1, "--panic"), (2, "--hang")):
        boot.try_(f"boot.cmdline.processor.max_cstate={n}")
        r = boot.reboot(flag)
        assert r["boots"][0]["outcome"] == flag[2:] and r["cmdline"] == base
        res = boot.gate()
        assert res["state"] == "lost" and "never came back" in res["reason"], res
        assert default_of(boot) is None and Grub(Host("sim", boot.root)).armed() is None
        assert not (boot.root / "boot/grub/custom.cfg").exists()  # the entry is gone
    assert [t["state"] for t in boot.status()["trials"]] == ["lost", "lost"]


def test_a_driver_option_rides_on_the_trial_entry_and_is_read_back_from_the_module(boot):
    boot.try_("driver.nvidia.NVreg_EnablePCIERelaxedOrderingMode=1")
    boot.reboot()
    assert "nvidia.NVreg_EnablePCIERelaxedOrderingMode=1" in boot.cmdline()
    assert (boot.root / "sys/module/nvidia/parameters/NVreg_EnablePCIERelaxedOrderingMode"
            ).read_text().strip() == "1"
    res = boot.gate()  # in force, but no faster: not kept
    assert res["state"] == "demoted" and "within_noise" in res["reason"], res


def test_refusals_change_nothing(boot):
    before = host_digest(boot.root)
    rc, _, err = boot("boot", "try", "boot.cmdline.iommu=pt")  # the shipped default policy
    assert rc == 1 and "boot.cmdline.iommu" in err and "forbidden" in err
    for args, what in ((["boot.cmdline.iommu=maybe"], "'maybe' is not one of"),
                       (["boot.cmdline.nosuch=1"], "unknown knob"),
                       (["gpu0.power_limit_w=500"], "not a boot-time knob"),
                       (["iommu"], "expected KNOB=VALUE")):
        rc, _, err = boot.try_(*args, expect=2)
        assert what in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert host_digest(boot.root) == before


def test_a_second_trial_waits_for_the_first(boot):
    boot.try_("boot.cmdline.iommu=pt")
    rc, _, err = boot.try_("boot.cmdline.hugepages=16", expect=1)
    assert "boot trial #1 is still rebooting" in err


def test_the_default_policy_refuses_reboot_effect_knobs_without_allow_reboot_effect(boot):
    from safety import policy as pol
    from tuner.knobs.registry import discover

    knobs = discover(Host("sim", boot.root))
    k = knobs["boot.cmdline.iommu"]
    assert k.effect.value == "reboot" and k.read() is None
    assert "forbidden" in str(pol.load_default().check(k, None, "pt"))
    p = pol.Policy.parse("version: 1\nrules:\n  - knob: 'boot.cmdline.*'\n")
    assert "allow_reboot_effect is false" in str(p.check(k, None, "pt"))


def test_a_bios_attribute_is_staged_for_the_trial_and_restaged_when_it_loses(boot):
    def bios() -> str:
        return boot.json("status")["current"]["bios.ProcCStates"]

    boot.try_("bios.ProcCStates=Disabled")
    assert bios() == "Enabled"  # staged at the BMC, not in force before the reset
    boot.reboot()
    assert bios() == "Disabled"  # read back from the BMC's current settings
    res = boot.gate()
    assert res["state"] == "demoted", res  # no faster in the model
    boot.reboot()
    assert bios() == "Enabled" and boot.gate()["state"] == "rolled_back"
