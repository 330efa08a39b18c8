"""NVreg_EnablePCIERelaxedOrderingMode: a modprobe.d knob that waits for a driver reload."""
from __future__ import annotations

import pytest

from tests.profiles import simhost
from tuner.knobs import driver, registry
from tuner.knobs.base import Effect, Unsupported

NAME = "driver.nvidia.NVreg_EnablePCIERelaxedOrderingMode"


@pytest.fixture
def root(tmp_path):
    return simhost.make(tmp_path / "h", pci=False)


def knob(root):
    return registry.discover(simhost.host(root), ["driver"])[NAME]


def test_reads_value_in_force_from_the_driver(root):
    k = knob(root)
    assert k.effect is Effect.DRIVER_RELOAD
    assert k.read() == 0 and k.pending() is None
    assert k.limits().values == [0, 1]


def test_apply_is_pending_until_reload_then_clear_restores(root):
    k = knob(root)
    distro = (root / "etc/modprobe.d/nvidia.conf").read_text()
    assert k.apply(1) == 1                      # read back = the staged value
    assert k.read() == 0 and k.pending() == 1   # still 0 in the loaded driver
    ours = (root / "etc/modprobe.d/99-metaltune-nvidia.conf").read_text()
    assert "options nvidia NVreg_EnablePCIERelaxedOrderingMode=1" in ours
    assert (root / "etc/modprobe.d/nvidia.conf").read_text() == distro  # not ours: untouched
    k.clear_pending()
    assert k.pending() is None
    assert not (root / "etc/modprobe.d/99-metaltune-nvidia.conf").exists()


def test_after_reload_the_value_is_in_force(root):
    k = knob(root)
    k.apply(1)
    params = root / "proc/driver/nvidia/params"
    params.chmod(0o644)
    params.write_text(params.read_text().replace("EnablePCIERelaxedOrderingMode: 0",
                                                 "EnablePCIERelaxedOrderingMode: 1"))
    assert k.read() == 1 and k.pending() is None


def test_writing_the_value_in_force_is_not_a_mismatch(root):
    k = knob(root)
    assert k.apply(0) is None  # nothing waits for a reload
    assert k.read() == 0 and k.pending() is None


def test_last_modprobe_file_wins(root):
    (root / "etc/modprobe.d/zz-local.conf").write_text(
        "options nvidia NVreg_EnablePCIERelaxedOrderingMode=1 NVreg_EnableMSI=1\n")
    val, src = driver.configured(simhost.host(root), "NVreg_EnablePCIERelaxedOrderingMode")
    assert val == 1 and src.endswith("zz-local.conf")
    assert knob(root).pending() == 1


def test_keeps_other_options_in_our_file(root):
    ours = root / "etc/modprobe.d/99-metaltune-nvidia.conf"
    ours.write_text("options nvidia NVreg_EnableMSI=1\n")
    k = knob(root)
    k.apply(1)
    k.clear_pending()
    assert ours.read_text().strip().endswith("options nvidia NVreg_EnableMSI=1")


def test_vm_and_no_driver(tmp_path):
    vm = simhost.make(tmp_path / "vm", vm=True, pci=False)
    assert isinstance(knob(vm).limits(), Unsupported)
    bare = tmp_path / "bare"
    (bare / "etc/modprobe.d").mkdir(parents=True)
    (bare / "host.json").write_text("{}")
    assert registry.discover(simhost.host(bare), ["driver"]) == {}
