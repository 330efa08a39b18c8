"""BIOS knobs against a real Redfish service: sushy-tools' emulator on 127.0.0.1 with libvirt's
in-process test driver (`test:///default`), which serves a System with BIOS attributes, an
attribute registry and a settings object whose PATCHes persist (applied at once: no pending state
there; pending/ETag behaviour is covered against the BMC double in tests/knobs).

Needs libvirt-python matching the system libvirt (CI: apt libvirt-dev pkg-config gcc, pip
libvirt-python==9.0.0). The test driver forgets its state when its last connection closes and the
emulator opens one per request, so the emulator runs in a small wrapper that keeps one open.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest
import requests

from tests.profiles import simhost
from tuner.bios.redfish import RedfishBios
from tuner.knobs import registry
from tuner.knobs.base import Choice

pytestmark = pytest.mark.peers

WRAPPER = """
import sys
import libvirt
keep = libvirt.open("test:///default")  # hold the test driver's state for the process lifetime
from sushy_tools.emulator.main import main
sys.argv = ["sushy-emulator", "--libvirt-uri", "test:///default", "-i", "127.0.0.1", "-p", sys.argv[1]]
sys.exit(main())
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def emulator(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("peer tests run as root (CI)")
    try:
        import libvirt  # noqa: F401
    except ImportError:
        pytest.fail("libvirt-python is not installed: apt-get install libvirt-dev pkg-config gcc; "
                    "pip install libvirt-python==9.0.0 (match `pkg-config --modversion libvirt`)")
    port = _free_port()
    log = tmp_path_factory.mktemp("sushy") / "emulator.log"
    with open(log, "w") as lf:
        proc = subprocess.Popen([sys.executable, "-c", WRAPPER, str(port)], stdout=lf,
                                stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            try:
                if requests.get(f"{url}/redfish/v1/Systems", timeout=1).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            if proc.poll() is not None:
                pytest.fail(f"sushy-emulator exited: {log.read_text()[-2000:]}")
            time.sleep(0.05)
        else:
            pytest.fail(f"sushy-emulator did not answer: {log.read_text()[-2000:]}")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def host_root(tmp_path, emulator):
    root = simhost.make(tmp_path / "h", pci=False)
    (root / "etc/metaltune/bmc.yaml").write_text(f"method: redfish\nurl: {emulator}\n")
    return root


def test_bios_attributes_and_registry_domains(host_root):
    ks = registry.discover(simhost.host(host_root), ["bios"])
    turbo = ks["bios.ProcTurboMode"]
    assert isinstance(turbo.limits(), Choice)
    assert sorted(turbo.limits().values) == ["Disabled", "Enabled"]
    assert ks["bios.QuietBoot"].limits().values == [False, True]       # Boolean
    assert ks["bios.L2Cache"].limits().kind == "unsupported"            # free String: not searched
    # read-only in the registry (NumCores, SecureBootStatus): not knobs
    assert "bios.NumCores" not in ks and "bios.SecureBootStatus" not in ks
    assert turbo.identity().startswith("bmc:http://127.0.0.1")


def test_apply_and_read_back_a_bios_attribute(host_root, emulator):
    k = registry.discover(simhost.host(host_root), ["bios"])["bios.ProcTurboMode"]
    start = k.read()
    other = "Disabled" if start == "Enabled" else "Enabled"
    try:
        assert k.apply(other) == other or k.read() == other
        # a fresh client (new connections) sees the persisted value
        assert RedfishBios(emulator).current()["ProcTurboMode"] == other
        # the settings object was found by following @Redfish.Settings
        assert RedfishBios(emulator).settings_uri().endswith("/BIOS/Settings")
    finally:
        RedfishBios(emulator).set({"ProcTurboMode": start})
    assert RedfishBios(emulator).current()["ProcTurboMode"] == start
