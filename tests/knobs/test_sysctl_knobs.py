"""sysctl knobs: only names from the allowed list, each with its domain; files under proc/sys."""
from __future__ import annotations

import pytest

from tests.profiles import simhost
from tuner.errors import OutOfDomain, UnknownKnob
from tuner.knobs import registry, sysctl
from tuner.knobs.base import Unsupported


@pytest.fixture
def root(tmp_path):
    return simhost.make(tmp_path / "h", pci=False)


def test_only_allowed_sysctls_that_exist(root):
    (root / "proc/sys/kernel/panic").write_text("0\n")  # exists, but not on the allowed list
    ks = registry.discover(simhost.host(root), ["sysctl"])
    assert set(ks) == {f"sysctl.{n}" for n in sysctl.ALLOWED}
    assert "sysctl.kernel.panic" not in ks
    assert "sysctl.kernel.numa_balancing" not in ks  # that one is os.numa_balancing
    with pytest.raises(UnknownKnob, match="sysctl.kernel.panic"):
        registry.get(ks, "sysctl.kernel.panic")


def test_write_and_read_back(root):
    k = registry.discover(simhost.host(root), ["sysctl"])["sysctl.vm.swappiness"]
    assert k.read() == 60
    assert k.apply(10) == 10
    assert (root / "proc/sys/vm/swappiness").read_text().strip() == "10"


def test_domain_checked_before_writing(root):
    ks = registry.discover(simhost.host(root), ["sysctl"])
    with pytest.raises(OutOfDomain, match="grid"):
        ks["sysctl.vm.swappiness"].apply(15)
    with pytest.raises(OutOfDomain):
        ks["sysctl.vm.max_map_count"].apply(12345)
    assert (root / "proc/sys/vm/swappiness").read_text().strip() == "60"


def test_read_only_in_a_vm(tmp_path):
    vm = simhost.make(tmp_path / "vm", vm=True, pci=False)
    k = registry.discover(simhost.host(vm), ["sysctl"])["sysctl.vm.swappiness"]
    assert isinstance(k.limits(), Unsupported)
