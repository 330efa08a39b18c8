"""systemd-boot: entry names with boot counting as systemd-boot and systemd-bless-boot read them
(`ID+LEFT-DONE.conf`), and a trial on a simulated systemd-boot host end to end."""
from __future__ import annotations

from tuner.boot import bls


def test_counted_names_parse_bless_and_bad_like_systemd():
    # examples from systemd's Automatic Boot Assessment documentation
    assert bls.split_name("4b4a0d2b0c1e4c0c8f3a-5.18.9+3.conf") == ("4b4a0d2b0c1e4c0c8f3a-5.18.9", 3, 0)
    assert bls.split_name("linux+2-1.conf") == ("linux", 2, 1)
    assert bls.split_name("linux.conf") == ("linux", None, None)
    assert bls.split_name("a+b+1-0.conf") == ("a+b", 1, 0)
    assert bls.blessed_name("metaltune-trial-3+0-1.conf") == "metaltune-trial-3.conf"
    assert bls.bad_name("metaltune-trial-3+0-1.conf") == "metaltune-trial-3+0-1.conf"
    assert bls.bad_name("linux+2-1.conf") == "linux+0-1.conf"
    assert bls.counted_name("metaltune-trial-1", 1, 0) == "metaltune-trial-1+1.conf"


def entries(b) -> list[str]:
    return sorted(p.name for p in (b.root / "boot/loader/entries").iterdir())


def test_trial_counts_a_try_then_is_blessed_and_made_default(bls_boot):
    b = bls_boot
    b.try_("boot.cmdline.iommu=pt")
    assert "metaltune-trial-1+1.conf" in entries(b)
    assert b.status()["loader"]["oneshot"] == "metaltune-trial-1"
    assert "iommu=pt" in b.reboot()["cmdline"]
    assert "metaltune-trial-1+0-1.conf" in entries(b)  # one try spent by the boot
    assert b.status()["loader"]["oneshot"] is None
    res = b.gate()
    assert res["state"] == "promoted", res
    assert "metaltune-trial-1.conf" in entries(b)
    assert b.status()["loader"]["default"] == "metaltune-trial-1"
    assert "iommu=pt" in b.reboot()["cmdline"]  # the default from now on


def test_a_panic_leaves_the_entry_with_no_tries_and_the_host_on_the_old_default(bls_boot):
    b = bls_boot
    base = b.cmdline()
    b.try_("boot.cmdline.intel_iommu=on")
    r = b.reboot("--panic")
    assert [x["outcome"] for x in r["boots"]] == ["panic", "up"] and b.cmdline() == base
    res = b.gate()
    assert res["state"] == "lost" and "never came back" in res["reason"]
    assert "metaltune-trial-1+0-1.conf" in entries(b)  # sorted last: never picked again
    assert b.status()["loader"]["default"] != "metaltune-trial-1"
    assert b.reboot()["cmdline"] == base.strip()


def test_writing_a_trial_pins_the_old_default_so_the_new_entry_never_wins_by_name(bls_boot):
    from tuner.boot.bls import Bls
    from tuner.host import Host

    b = bls_boot
    old = Bls(Host("sim", b.root)).default()
    assert old is not None and not Bls(Host("sim", b.root)).pinned()
    b.try_("boot.cmdline.iommu=pt", "--no-reboot")
    bl = Bls(Host("sim", b.root))
    assert bl.pinned() and bl.default() == old
    assert bl.boot_order()[0].name == "metaltune-trial-1+1.conf"  # first in the menu, not default
