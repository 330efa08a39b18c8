"""Monitors that read files (kernel log, AER counters) and the canary, plus Xid classification."""
from __future__ import annotations

import os
import time

import pytest

from safety.incident import classify_xid
from safety.monitors import AerMonitor, CanaryMonitor, KmsgXidMonitor
from safety.monitors.kmsg import parse_xid
from safety.monitors.pcie import parse_aer


def test_xid_classification_follows_dcgm():
    assert {x: classify_xid(x) for x in (48, 74, 79, 95, 119, 120, 140)} == dict.fromkeys(
        (48, 74, 79, 95, 119, 120, 140), "fatal")
    assert classify_xid(94) == "warning"
    assert {classify_xid(x) for x in (13, 31, 43)} == {"info"}


def test_parse_nvrm_xid_lines():
    assert parse_xid("NVRM: Xid (PCI:0000:2b:00): 79, pid=1234, GPU has fallen off the bus.") == (
        "0000:2b:00", 79, "pid=1234, GPU has fallen off the bus.")
    assert parse_xid("[ 12.3] NVRM: Xid (PCI:0000:17:00.0): 13, Graphics Exception")[1] == 13
    assert parse_xid("NVRM: loading NVIDIA UNIX Open Kernel Module") is None


def test_kmsg_plain_file_reports_only_new_lines(tmp_path):
    kmsg = tmp_path / "dev" / "kmsg"
    kmsg.parent.mkdir()
    kmsg.write_text("NVRM: Xid (PCI:0000:2b:00): 79, old news\n")
    m = KmsgXidMonitor(tmp_path)
    m.arm()
    assert m.poll() == []
    with open(kmsg, "a") as f:
        f.write("usb 1-1: new device\nNVRM: Xid (PCI:0000:2b:00): 48, DBE\nNVRM: Xid (PCI:0000:2b:00): 1")
    inc = m.poll()
    assert [(i.xid, i.severity, i.gpu) for i in inc] == [(48, "fatal", "0000:2b:00")]
    with open(kmsg, "a") as f:  # the half-written line completes
        f.write("3, Graphics SM Exception\n")
    assert [(i.xid, i.severity) for i in m.poll()] == [(13, "info")]
    assert m.poll() == []


@pytest.mark.skipif(not os.access("/dev/kmsg", os.R_OK), reason="needs root to read /dev/kmsg")
def test_kmsg_real_character_device_reads_records_without_error():
    m = KmsgXidMonitor("/")
    try:
        m.arm()
    except PermissionError:  # a container without CAP_SYSLOG
        pytest.skip("/dev/kmsg not readable here")
    assert m.device
    assert isinstance(m.poll(), list)  # one record per read, EAGAIN at the end
    m.close()


def test_aer_counters(tmp_path):
    dev = tmp_path / "sys/bus/pci/devices/0000:17:00.0"
    dev.mkdir(parents=True)
    (dev / "aer_dev_correctable").write_text("RxErr 0\nBadTLP 0\nTOTAL_ERR_COR 0\n")
    (dev / "aer_dev_nonfatal").write_text("Undefined 0\nTOTAL_ERR_NONFATAL 0\n")
    (dev / "aer_dev_fatal").write_text("0\n")
    m = AerMonitor(tmp_path)
    m.arm()
    assert m.poll() == []
    (dev / "aer_dev_correctable").write_text("RxErr 3\nBadTLP 0\nTOTAL_ERR_COR 3\n")
    assert [(i.type, i.severity) for i in m.poll()] == [("aer", "warning")]
    (dev / "aer_dev_fatal").write_text("1\n")
    inc = m.poll()
    assert [(i.severity, i.data["kind"], i.gpu) for i in inc] == [("fatal", "fatal", "0000:17:00.0")]
    assert m.poll() == []
    assert parse_aer("DLP 2\nTLP 1\n") == 3 and parse_aer(None) is None


def _poll_until(m, timeout=3.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        inc = m.poll()
        if inc:
            return inc
        time.sleep(0.02)
    return []


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_canary_wrong_answer_and_hang(mode):
    ok = CanaryMonitor(lambda: 6 * 7, expected=42, timeout_s=1, interval_s=0, mode=mode)
    ok.arm()
    assert _poll_until(ok, 0.5) == [] and ok.runs >= 2
    wrong = CanaryMonitor(lambda: 41, expected=42, timeout_s=1, interval_s=0, mode=mode)
    wrong.arm()
    inc = _poll_until(wrong)
    assert inc[0].type == "canary_failed" and "41" in inc[0].detail and inc[0].fatal
    hang = CanaryMonitor(lambda: time.sleep(60), timeout_s=0.3, interval_s=0, mode=mode)
    hang.arm()
    t0 = time.monotonic()
    inc = _poll_until(hang)
    assert inc[0].type == "canary_hang" and inc[0].reason == "instability_hang"
    assert time.monotonic() - t0 < 1.5
    boom = CanaryMonitor(lambda: 1 / 0, timeout_s=1, interval_s=0, mode=mode)
    boom.arm()
    assert "ZeroDivisionError" in _poll_until(boom)[0].detail
