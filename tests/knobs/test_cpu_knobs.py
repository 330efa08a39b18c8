"""CPU/OS knobs on the simulated host's sysfs/procfs tree: the files a kernel has, the values
written to every CPU, boost's two interfaces, C-state limits via cpuidle, THP's format, VMs."""
from __future__ import annotations

import os
import struct

import pytest

from tests.profiles import simhost
from tuner.errors import OutOfDomain
from tuner.knobs import cpu, registry
from tuner.knobs.base import Unsupported

CPU = "sys/devices/system/cpu"


@pytest.fixture
def h200(tmp_path):
    return simhost.make(tmp_path / "h", "h200", pci=False)


@pytest.fixture
def rtx(tmp_path):
    return simhost.make(tmp_path / "r", "rtx4090", pci=False)


def knobs(root, **kw):
    return registry.discover(simhost.host(root, **kw), ["cpu"])


def test_discovers_cpu_and_os_knobs(h200):
    assert set(knobs(h200)) == {"cpu.governor", "cpu.energy_performance_preference", "cpu.boost",
                                "cpu.max_cstate_latency_us", "os.numa_balancing",
                                "os.transparent_hugepages"}


def test_governor_written_to_every_cpu(h200):
    k = knobs(h200)["cpu.governor"]
    assert k.read() == "powersave"
    assert k.limits().values == ["performance", "powersave"]
    assert k.apply("performance") == "performance"
    for d in sorted((h200 / CPU).glob("cpu[0-9]*")):
        assert (d / "cpufreq/scaling_governor").read_text().strip() == "performance"
    with pytest.raises(OutOfDomain, match="schedutil"):
        k.apply("schedutil")  # not offered by intel_pstate


def test_mixed_governors_read_as_drift(h200):
    (h200 / CPU / "cpu3/cpufreq/scaling_governor").write_text("performance\n")
    k = knobs(h200)["cpu.governor"]
    assert k.read().startswith("mixed(")
    k.apply("powersave")
    assert k.read() == "powersave"


def test_boost_intel_no_turbo_is_inverted(h200):
    k = knobs(h200)["cpu.boost"]
    assert k.read() is True
    k.apply(False)
    assert (h200 / CPU / "intel_pstate/no_turbo").read_text().strip() == "1"
    assert k.read() is False


def test_boost_acpi_cpufreq(rtx):
    k = knobs(rtx)["cpu.boost"]
    k.apply(False)
    assert (rtx / CPU / "cpufreq/boost").read_text().strip() == "0"
    assert "cpu.energy_performance_preference" not in knobs(rtx)  # no HWP on acpi-cpufreq


def test_cstate_limit_disables_deeper_states_everywhere(h200):
    k = knobs(h200)["cpu.max_cstate_latency_us"]
    assert k.read() == 170
    assert k.limits().search_values() == [0, 2, 10, 170]
    assert k.apply(10) == 10
    for d in (h200 / CPU).glob("cpu[0-9]*"):
        lat_dis = {int((s / "latency").read_text()): (s / "disable").read_text().strip()
                   for s in (d / "cpuidle").glob("state*")}
        assert lat_dis == {0: "0", 2: "0", 10: "0", 170: "1"}
    # a bound between two states keeps the shallower one; the read-back is that state's latency
    assert k.apply(5) == 2
    assert k.search_points() == [0, 2, 10, 170]
    assert k.apply(5000) == 170  # above the deepest state: everything enabled
    assert k.read() == 170


def test_cpu_dma_latency_hold_writes_binary_s32_and_closes(h200):
    h = cpu.CpuDmaLatencyHold(simhost.host(h200), 0)
    with h:
        assert h.fd is not None
        assert (h200 / "dev/cpu_dma_latency").read_bytes() == struct.pack("=i", 0)
    assert h.fd is None


def test_numa_balancing_and_thp(h200):
    ks = knobs(h200)
    ks["os.numa_balancing"].apply(0)
    assert (h200 / "proc/sys/kernel/numa_balancing").read_text().strip() == "0"
    thp = ks["os.transparent_hugepages"]
    assert thp.read() == "always"
    assert thp.limits().values == ["always", "madvise", "never"]
    assert thp.apply("madvise") == "madvise"


def test_thp_kernel_format(h200):
    (h200 / "sys/kernel/mm/transparent_hugepage/enabled").write_text("always [madvise] never\n")
    assert knobs(h200)["os.transparent_hugepages"].read() == "madvise"


def test_vm_makes_host_knobs_read_only(tmp_path):
    vm = simhost.make(tmp_path / "vm", "h200", vm=True, pci=False)
    ks = knobs(vm)
    for name, k in ks.items():
        assert isinstance(k.limits(), Unsupported), name
        assert k.read() is not None
        with pytest.raises(OutOfDomain):
            k.apply(k.read())


def test_missing_interfaces_mean_no_knob(tmp_path):
    root = tmp_path / "bare"
    (root / "proc/sys/kernel").mkdir(parents=True)
    (root / "host.json").write_text("{}")
    assert knobs(root) == {}
    os.makedirs(root / CPU / "cpu0")
    assert knobs(root) == {}
