"""`verify` on boot-time values, as TuneD's bootloader verify does: what /proc/cmdline has is what
counts; a value missing or present with another value is named; a value the default boot entry
has but the running kernel does not is pending a reboot."""
from __future__ import annotations

import json

from tests.boot.conftest import needs_grub
from tuner.boot.grub import Grub
from tuner.host import Host

pytestmark = needs_grub


def verify(boot, prof) -> tuple[int, dict]:
    rc, out, err = boot("verify", str(prof), "--json")
    assert rc in (0, 1), err
    return rc, json.loads(out)


def test_verify_reads_proc_cmdline_and_names_what_is_missing_or_different(boot, tmp_path):
    prof = tmp_path / "boot.yaml"
    prof.write_text("name: boot-test\ndescription: boot-time values\nknobs:\n"
                    "  boot.cmdline.iommu: pt\n  boot.cmdline.transparent_hugepage: never\n")
    rc, out, _ = boot("verify", str(prof))
    assert rc == 1
    assert "iommu is missing from /proc/cmdline (expected iommu=pt)" in out
    assert "boot try" in out and "metaltune apply" not in out
    boot.try_("boot.cmdline.iommu=pt", "boot.cmdline.transparent_hugepage=madvise")
    boot.reboot()
    rc, res = verify(boot, prof)
    by = {it["knob"]: it for it in res["knobs"]}
    assert rc == 1 and by["boot.cmdline.iommu"]["status"] == "ok"
    assert by["boot.cmdline.transparent_hugepage"]["status"] == "drifted"
    assert by["boot.cmdline.transparent_hugepage"]["reason"] == \
        "transparent_hugepage=madvise in /proc/cmdline, expected transparent_hugepage=never"
    # the trial entry made the default by hand, not yet booted: pending a reboot
    boot.gate()  # decided (whatever the verdict): nothing armed
    g = Grub(Host("sim", boot.root))
    g.write_trial("by-hand", g.options_of(None) + " transparent_hugepage=never", "by hand")
    g.promote("by-hand")
    rc, res = verify(boot, prof)
    by = {it["knob"]: it for it in res["knobs"]}
    assert by["boot.cmdline.transparent_hugepage"]["status"] == "pending-reboot"
    assert by["boot.cmdline.transparent_hugepage"]["pending"] == "never"
