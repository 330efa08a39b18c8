"""The GRUB adapter against the real `grub-editenv` on a simulated host's grubenv: a one-shot
entry (`grub-reboot`'s next_entry), promotion (`saved_entry`), demotion, and a dry run that shows
the entry and the commands and writes nothing."""
from __future__ import annotations

import subprocess

from tests.boot.conftest import needs_grub
from tests.simhelpers import host_digest
from tuner.boot.commands import Actions
from tuner.boot.grub import Grub
from tuner.host import Host

pytestmark = needs_grub


def env_list(g: Grub) -> dict[str, str]:
    out = subprocess.run(["grub-editenv", str(g.env), "list"], capture_output=True, text=True,
                         check=True).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def test_arm_promote_demote_as_grub_editenv_reads_them(boot):
    g = Grub(Host("sim", boot.root))
    user = "menuentry 'rescue' --id 'my-rescue' {\n\tlinux /vmlinuz single\n}\n"
    g.custom.write_text(user)  # the operator's own custom.cfg content survives every step
    g.check()
    g.write_trial("metaltune-trial-1", "root=UUID=x ro iommu=pt", "metaltune trial 1")
    g.arm_once("metaltune-trial-1")
    assert env_list(g) == {"next_entry": "metaltune-trial-1"}
    e = g.find("metaltune-trial-1")
    assert e["kernel"] == "/vmlinuz-6.8.0-49-generic" and e["options"] == "root=UUID=x ro iommu=pt"
    assert "initrd" in e["body"] and g.custom.read_text().startswith(user)
    g.demote("metaltune-trial-1")
    assert env_list(g) == {} and g.find("metaltune-trial-1") is None
    assert g.custom.read_text() == user
    g.write_trial("metaltune-trial-2", "root=UUID=x ro", "metaltune trial 2")
    g.promote("metaltune-trial-2")
    assert env_list(g) == {"saved_entry": "metaltune-trial-2"}
    assert g.default_entry()["id"] == "metaltune-trial-2"


def test_a_one_shot_is_spent_by_the_boot_that_uses_it(boot):
    base = boot.cmdline()
    g = Grub(Host("sim", boot.root))
    g.write_trial("metaltune-trial-1", "root=UUID=x ro iommu=pt", "t")
    g.arm_once("metaltune-trial-1")
    assert "iommu=pt" in boot.reboot()["cmdline"]
    assert env_list(g) == {}  # grub.cfg cleared next_entry before loading the kernel
    assert boot.reboot()["cmdline"].strip() == base.strip()


def test_dry_run_shows_entry_and_commands_and_writes_nothing(boot):
    before = host_digest(boot.root)
    res = boot.json("boot", "try", "boot.cmdline.iommu=pt", "--policy", str(boot.policy),
                    "--dry-run")
    assert host_digest(boot.root) == before and not boot.state.joinpath("journal.db").exists()
    runs = [s["run"] for s in res["plan"] if "run" in s]
    assert runs == [["grub-editenv", str(boot.root / "boot/grub/grubenv"), "set",
                     "next_entry=metaltune-trial-1"], ["systemctl", "reboot"]]
    written = next(s for s in res["plan"] if "write" in s)
    assert written["write"].endswith("boot/grub/custom.cfg")
    assert "--id 'metaltune-trial-1'" in written["text"] and " iommu=pt" in written["text"]


def test_grub_default_not_saved_is_refused_with_one_line(boot):
    (boot.root / "etc/default/grub").write_text("GRUB_DEFAULT=0\n")
    before = host_digest(boot.root)
    rc, out, err = boot.try_("boot.cmdline.iommu=pt", expect=1)
    assert "GRUB_DEFAULT" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert host_digest(boot.root) == before
