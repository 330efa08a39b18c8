"""PCIe Device Control: decoding checked against lspci, capability walking, read-modify-write of
owned bits only (never bit 15), which devices are tuned, and read-only VMs."""
from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from hypothesis import given, settings, strategies as st

from tests.profiles import simhost
from tuner.errors import DryRunRefused, KnobUnavailable, OutOfDomain
from tuner.knobs import registry
from tuner.knobs.base import Unsupported
from tuner.pci import config as cfg

LSPCI = shutil.which("lspci")


def lspci_devctl(data: bytes, tmp_path) -> dict:
    """Decode config bytes with `lspci -F` (pciutils reads a dump in `lspci -x` format)."""
    f = tmp_path / "dump.txt"
    f.write_text(cfg.to_lspci_x(data, "17:00.0", "3D controller"))
    out = subprocess.run([LSPCI, "-F", str(f), "-vv"], capture_output=True, text=True,
                         check=True).stdout
    m = re.search(r"DevCtl:\s*(.*?)\n\s*(.*?)\n\s*MaxPayload (\d+) bytes, MaxReadReq (\d+) bytes",
                  out, re.S)
    assert m, out
    flags = dict(re.findall(r"(\w+)([+-])", m.group(1) + " " + m.group(2)))
    cap = re.search(r"Capabilities: \[([0-9a-f]+)\] Express", out)
    return {"flags": {k: v == "+" for k, v in flags.items()}, "payload": int(m.group(3)),
            "readrq": int(m.group(4)), "cap": int(cap.group(1), 16)}


@pytest.mark.skipif(LSPCI is None, reason="pciutils (lspci) not installed")
@settings(max_examples=25, deadline=None)
@given(devctl=st.integers(0, 0xFFFF))
def test_devctl_decoding_matches_lspci(devctl, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lspci")
    data = cfg.build_config(0x10DE, 0x2335, 0x030200, devctl=devctl, size=256)
    ours = cfg.decode_devctl(data)
    theirs = lspci_devctl(data, tmp)
    assert ours.offset - cfg.DEVCTL == theirs["cap"]
    assert ours.RlxdOrd == theirs["flags"]["RlxdOrd"]
    assert ours.MaxReadReq == theirs["readrq"]
    assert ours.MaxPayload == theirs["payload"]
    for name in ("CorrErr", "NonFatalErr", "FatalErr", "UnsupReq", "ExtTag", "PhantFunc",
                 "AuxPwr", "NoSnoop"):
        assert getattr(ours, name) == theirs["flags"][name], name


@pytest.mark.skipif(LSPCI is None, reason="pciutils (lspci) not installed")
def test_rmw_result_decoded_by_lspci(tmp_path):
    data = bytearray(cfg.build_config(0x10DE, 0x2335, 0x030200, devctl=0x2930, size=256))
    off = cfg.devctl_offset(bytes(data))
    new = cfg.set_owned_bits(cfg.u16(data, off), relaxed_ordering=False, max_read_request=4096)
    data[off:off + 2] = new.to_bytes(2, "little")
    theirs = lspci_devctl(bytes(data), tmp_path)
    assert theirs["readrq"] == 4096 and theirs["flags"]["RlxdOrd"] is False
    # untouched fields as before: MaxPayload 256, ExtTag+, NoSnoop+
    assert theirs["payload"] == 256 and theirs["flags"]["ExtTag"] and theirs["flags"]["NoSnoop"]


@given(devctl=st.integers(0, 0xFFFF), ro=st.booleans() | st.none(),
       mrrs=st.sampled_from(cfg.SIZES + [None]))
def test_set_owned_bits_touches_only_owned_bits_and_never_flr(devctl, ro, mrrs):
    new = cfg.set_owned_bits(devctl, relaxed_ordering=ro, max_read_request=mrrs)
    owned = (cfg.DEVCTL_RELAX_EN if ro is not None else 0) | (cfg.DEVCTL_READRQ if mrrs else 0)
    assert new & cfg.DEVCTL_BCR_FLR == 0
    assert (new ^ devctl) & ~owned & ~cfg.DEVCTL_BCR_FLR & 0xFFFF == 0
    if ro is not None:
        assert bool(new & cfg.DEVCTL_RELAX_EN) == ro
    if mrrs:
        assert cfg.readrq_bytes(new) == mrrs


def test_capability_walk_follows_pointers_and_survives_loops():
    data = bytearray(cfg.build_config(0x10DE, 0x2335, 0x030200, size=256))
    assert [c for c, _ in cfg.capabilities(bytes(data))] == [0x01, 0x05, 0x10, 0x11]
    # move the PCIe capability first in the list: still found by walking
    data[cfg.CAP_PTR] = 0x78
    data[0x79] = 0x60
    data[0x69] = 0xB4
    data[0xB5] = 0x00
    assert cfg.pcie_cap(bytes(data)) == 0x78
    # a list that points back into itself terminates
    data[0xB5] = 0x60
    assert len(list(cfg.capabilities(bytes(data)))) == 4
    # no capability list bit in Status: nothing to walk
    data[6] = 0
    with pytest.raises(cfg.ConfigError):
        cfg.pcie_cap(bytes(data))


def test_unprivileged_64_byte_view_is_reported_clearly():
    data = cfg.build_config(0x10DE, 0x2335, 0x030200)[:64]
    with pytest.raises(cfg.ConfigError, match="64 bytes"):
        cfg.pcie_cap(data)


@pytest.fixture
def sim(tmp_path):
    return simhost.make(tmp_path / "host")


def test_gpus_and_nics_on_their_path_only(sim):
    knobs = registry.discover(simhost.host(sim), ["pcie"])
    bdfs = {n[len("pcie."):].rsplit(".", 1)[0] for n in knobs}
    assert bdfs == {simhost.GPU, simhost.NIC_ON_PATH}
    assert f"pcie.{simhost.GPU}.relaxed_ordering" in knobs
    assert f"pcie.{simhost.GPU}.max_read_request_bytes" in knobs


def test_parents_from_a_real_sysfs_symlink_layout(tmp_path):
    """On a real host the topology comes from the link target, not `parent` files."""
    from tuner.host import Host
    from tuner.pci.sysfs import list_devices

    root = tmp_path / "r"
    devroot = root / "sys/devices/pci0000:00/0000:00:01.0/0000:15:00.0/0000:16:00.0/0000:17:00.0"
    devroot.mkdir(parents=True)
    (devroot / "vendor").write_text("0x10de\n")
    (devroot / "device").write_text("0x2335\n")
    (devroot / "class").write_text("0x030200\n")
    links = root / "sys/bus/pci/devices"
    links.mkdir(parents=True)
    (links / "0000:17:00.0").symlink_to(
        "../../../devices/pci0000:00/0000:00:01.0/0000:15:00.0/0000:16:00.0/0000:17:00.0")
    (root / "host.json").write_text("{}")
    [d] = list_devices(Host("sim", root))
    assert d.parents == ["0000:00:01.0", "0000:15:00.0", "0000:16:00.0"]
    assert d.is_nvidia_gpu


def test_apply_writes_only_the_owned_bits_and_reads_back(sim):
    knobs = registry.discover(simhost.host(sim), ["pcie"])
    path = sim / "sys/bus/pci/devices" / simhost.GPU / "config"
    before = path.read_bytes()
    off = cfg.devctl_offset(before)
    assert knobs[f"pcie.{simhost.GPU}.max_read_request_bytes"].apply(4096) == 4096
    assert knobs[f"pcie.{simhost.GPU}.relaxed_ordering"].apply(False) is False
    after = path.read_bytes()
    # only the two Device Control bytes changed, and only bits 4 and 14:12 in them
    diff = [i for i, (a, b) in enumerate(zip(before, after)) if a != b]
    assert set(diff) <= {off, off + 1}
    d0, d1 = cfg.u16(before, off), cfg.u16(after, off)
    assert (d0 ^ d1) & ~(cfg.DEVCTL_RELAX_EN | cfg.DEVCTL_READRQ) == 0
    assert cfg.readrq_bytes(d1) == 4096 and not d1 & cfg.DEVCTL_RELAX_EN
    # the NIC on the path is untouched
    nic = registry.discover(simhost.host(sim), ["pcie"])[f"pcie.{simhost.NIC_ON_PATH}.max_read_request_bytes"]
    assert nic.read() == 512


def test_flr_bit_is_never_written_even_if_read_as_set(sim):
    path = sim / "sys/bus/pci/devices" / simhost.GPU / "config"
    data = bytearray(path.read_bytes())
    off = cfg.devctl_offset(bytes(data))
    data[off + 1] |= 0x80  # bit 15 set in what we read
    path.write_bytes(bytes(data))
    k = registry.discover(simhost.host(sim), ["pcie"])[f"pcie.{simhost.GPU}.relaxed_ordering"]
    k.apply(True)
    assert not cfg.u16(path.read_bytes(), off) & cfg.DEVCTL_BCR_FLR


def test_domain_and_out_of_domain_values(sim):
    k = registry.discover(simhost.host(sim), ["pcie"])[f"pcie.{simhost.GPU}.max_read_request_bytes"]
    assert k.limits().values == [128, 256, 512, 1024, 2048, 4096]
    with pytest.raises(OutOfDomain, match="8192"):
        k.apply(8192)
    with pytest.raises(OutOfDomain):
        k.apply(300)


def test_dry_run_host_refuses_to_write(sim):
    k = registry.discover(simhost.host(sim, dry_run=True), ["pcie"])[f"pcie.{simhost.GPU}.relaxed_ordering"]
    before = (sim / "sys/bus/pci/devices" / simhost.GPU / "config").read_bytes()
    with pytest.raises(DryRunRefused):
        k.apply(False)
    assert (sim / "sys/bus/pci/devices" / simhost.GPU / "config").read_bytes() == before


def test_vm_config_space_is_read_only(tmp_path):
    root = simhost.make(tmp_path / "vm", vm=True)
    k = registry.discover(simhost.host(root), ["pcie"])[f"pcie.{simhost.GPU}.relaxed_ordering"]
    assert k.read() is True  # still readable
    assert isinstance(k.limits(), Unsupported)
    with pytest.raises(OutOfDomain):
        k.apply(False)
    dev = k.dev
    with pytest.raises(KnobUnavailable, match="read-only"):
        dev.update_devctl(relaxed_ordering=False)


def test_device_without_pcie_capability_is_unsupported(sim):
    path = sim / "sys/bus/pci/devices" / simhost.GPU / "config"
    path.write_bytes(path.read_bytes()[:64])  # what a non-root reader sees
    k = registry.discover(simhost.host(sim), ["pcie"])[f"pcie.{simhost.GPU}.relaxed_ordering"]
    assert isinstance(k.limits(), Unsupported) and "64 bytes" in k.limits().reason
    assert k.describe()["value"] is None


# The first 256 bytes of config space of the lent H200 (0000:00:06.0, a Firecracker VM, read
# 2026-11-29 by `metaltune host --backend real`), as `lspci -x` prints them.
H200_CONFIG = """\
00: de 10 35 23 46 05 10 00 a1 00 02 03 00 00 00 00
10: 0c 00 00 02 40 10 00 00 0c 00 00 00 00 10 00 00
20: 0c 00 00 00 40 10 00 00 00 00 00 00 de 10 bf 18
30: 00 00 00 00 40 00 00 00 00 00 00 00 ff 01 00 00
40: 01 48 13 00 08 00 00 00 05 60 88 03 00 00 00 00
50: 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
60: 10 b0 02 00 21 80 2c 11 34 51 00 00 05 79 45 00
70: 00 00 05 11 00 00 00 00 00 00 00 00 00 00 00 00
80: 00 00 00 00 13 08 07 00 40 10 00 00 3e 00 80 01
90: 05 00 5e 00 00 00 00 00 00 00 00 00 00 00 00 00
a0: 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
b0: 11 00 08 80 00 00 b9 00 00 00 ba 00 00 00 00 00
c0: 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
d0: 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
e0: 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
f0: 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
"""


def _parse_lspci_x(text: str) -> bytes:
    out = bytearray()
    for line in text.strip().splitlines():
        out += bytes(int(x, 16) for x in line.split(":", 1)[1].split())
    return bytes(out)


def test_real_h200_config_bytes(tmp_path):
    data = _parse_lspci_x(H200_CONFIG)
    d = cfg.decode_devctl(data)
    # what lspci -vv printed for these bytes on the machine that has them:
    # Capabilities: [60] Express (v2) Endpoint; DevCtl: FatalErr+ RlxdOrd+ ExtTag+ NoSnoop-
    # MaxPayload 256 bytes, MaxReadReq 4096 bytes
    assert (d.offset, d.raw) == (0x68, 0x5134)
    assert (d.RlxdOrd, d.ExtTag, d.NoSnoop, d.FatalErr) == (True, True, False, True)
    assert (d.MaxPayload, d.MaxReadReq, d.port_type) == (256, 4096, "Endpoint")
    assert cfg.link_status(data)["speed_gen"] == 5 and cfg.link_status(data)["width"] == 16
    if LSPCI:
        theirs = lspci_devctl(data, tmp_path)
        assert theirs["cap"] == 0x60 and theirs["readrq"] == 4096 and theirs["flags"]["RlxdOrd"]
