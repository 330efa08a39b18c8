"""FakeNVML behaves like NVML on the probed H200 and on a GeForce card: values, units, return kinds,
the real exception classes, silent setters, and the event-set API fed by injected events."""
from __future__ import annotations

import ctypes
import json
import subprocess
import sys
import time

import pynvml
import pytest

from tests.sim.conftest import make_host
from tuner.sim.fake_pynvml import FakeNVML
from tuner.sim.inject import inject

FACTS = {  # docs/readings/h200-probe-2026-11-29.json
    "power_constraints_mw": [200000, 700000], "power_default_mw": 700000,
    "supported_mem_clocks": [3201, 2201], "supported_gr_clocks_at_top_mem": [110, 1980, 345],
    "gpc_min_max_offset": (0, 0), "persistence": 1, "ecc_mode": [1, 1], "pcie": (5, 16),
    "name": "NVIDIA H200", "supported_event_types": 65439,
}


def test_h200_reads_like_the_probed_device(h200, nvml_of):
    nv = nvml_of(h200)
    h = nv.nvmlDeviceGetHandleByIndex(0)
    assert isinstance(h, pynvml.c_nvmlDevice_t)
    assert nv.nvmlDeviceGetName(h) == FACTS["name"]
    assert nv.nvmlDeviceGetPowerManagementLimitConstraints(h) == FACTS["power_constraints_mw"]
    assert nv.nvmlDeviceGetPowerManagementDefaultLimit(h) == FACTS["power_default_mw"]
    assert nv.nvmlDeviceGetPowerManagementLimit(h) == 700000
    assert nv.nvmlDeviceGetSupportedMemoryClocks(h) == FACTS["supported_mem_clocks"]
    gr = nv.nvmlDeviceGetSupportedGraphicsClocks(h, 3201)
    assert [len(gr), gr[0], gr[-1]] == FACTS["supported_gr_clocks_at_top_mem"]
    assert all(a - b == 15 for a, b in zip(gr, gr[1:]))
    assert nv.nvmlDeviceGetGpcClkMinMaxVfOffset(h) == FACTS["gpc_min_max_offset"]
    assert nv.nvmlDeviceGetMemClkMinMaxVfOffset(h) == (0, 0)
    lo, hi = ctypes.c_int(7), ctypes.c_int(7)  # the by-reference form fills the caller's ints
    assert nv.nvmlDeviceGetGpcClkMinMaxVfOffset(h, ctypes.byref(lo), ctypes.byref(hi)) == 0
    assert (lo.value, hi.value) == (0, 0)
    assert nv.nvmlDeviceGetPersistenceMode(h) == FACTS["persistence"]
    assert nv.nvmlDeviceGetEccMode(h) == FACTS["ecc_mode"]
    assert (nv.nvmlDeviceGetCurrPcieLinkGeneration(h), nv.nvmlDeviceGetCurrPcieLinkWidth(h)) == FACTS["pcie"]
    assert nv.nvmlDeviceGetSupportedEventTypes(h) == FACTS["supported_event_types"]
    assert nv.nvmlDeviceGetVirtualizationMode(h) == pynvml.NVML_GPU_VIRTUALIZATION_MODE_NONE
    assert nv.nvmlDeviceGetCurrentClocksEventReasons(h) == pynvml.nvmlClocksEventReasonGpuIdle
    assert nv.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_GRAPHICS) == 345  # idle, as probed
    assert nv.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_MEM) == 3201
    assert nv.nvmlDeviceGetTemperatureThreshold(h, pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN) > \
        nv.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
    mem = nv.nvmlDeviceGetMemoryInfo(h)
    assert isinstance(mem, pynvml.c_nvmlMemory_t) and mem.total == mem.free + mem.used
    pci = nv.nvmlDeviceGetPciInfo(h)
    assert isinstance(pci, pynvml.nvmlPciInfo_t)
    assert pci.pciDeviceId == 0x233510DE and pci.busId == "00000000:18:00.0"
    # GeForce: no application clocks, offsets supported, no row remapping
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nv.nvmlDeviceGetAPIRestriction(h, 0)


def test_identity_lookups_and_real_error_classes(tmp_path, nvml_of):
    root = make_host(tmp_path, gpus=3, seed=5)
    nv = nvml_of(root)
    assert nv.nvmlDeviceGetCount() == 3
    uuids = [nv.nvmlDeviceGetUUID(nv.nvmlDeviceGetHandleByIndex(i)) for i in range(3)]
    assert len(set(uuids)) == 3 and all(u.startswith("GPU-") for u in uuids)
    h2 = nv.nvmlDeviceGetHandleByUUID(uuids[2])
    assert nv.nvmlDeviceGetIndex(h2) == 2
    for busid in ("0000:3a:00.0", "00000000:3A:00.0", b"3a:00.0"):
        assert nv.nvmlDeviceGetIndex(nv.nvmlDeviceGetHandleByPciBusId(busid)) == 2
    with pytest.raises(pynvml.NVMLError_NotFound):
        nv.nvmlDeviceGetHandleByUUID("GPU-00000000-0000-0000-0000-000000000000")
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nv.nvmlDeviceGetHandleByIndex(3)
    h = nv.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_InvalidArgument) as ei:
        nv.nvmlDeviceSetPowerManagementLimit(h, 750000)
    assert isinstance(ei.value, pynvml.NVMLError) and ei.value.value == pynvml.NVML_ERROR_INVALID_ARGUMENT
    with pytest.raises(pynvml.NVMLError_NotFound):
        nv.nvmlDeviceGetSupportedGraphicsClocks(h, 1234)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nv.nvmlDeviceSetGpcClkVfOffset(h, 100)
    nv2 = FakeNVML(root)  # never initialised
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        nv2.nvmlDeviceGetCount()


def test_settings_are_shared_between_instances_and_silent_setters_stay_silent(h200, nvml_of):
    a, b = nvml_of(h200), nvml_of(h200)
    ha, hb = a.nvmlDeviceGetHandleByIndex(0), b.nvmlDeviceGetHandleByIndex(0)
    a.nvmlDeviceSetPowerManagementLimit(ha, 550000)
    assert b.nvmlDeviceGetPowerManagementLimit(hb) == 550000
    assert b.nvmlDeviceGetEnforcedPowerLimit(hb) == 550000
    # _v2 ignores the C return code in nvidia-ml-py: an invalid value "succeeds" and changes nothing
    assert a.nvmlDeviceSetPowerManagementLimit_v2(ha, pynvml.NVML_POWER_SCOPE_GPU, 900000) == 0
    assert b.nvmlDeviceGetPowerManagementLimit(hb) == 550000
    assert a.nvmlDeviceSetPowerManagementLimit_v2(ha, pynvml.NVML_POWER_SCOPE_GPU, 600000) == 0
    assert b.nvmlDeviceGetPowerManagementLimit(hb) == 600000
    a.nvmlDeviceSetGpuLockedClocks(ha, 1500, 1500)
    assert b.nvmlDeviceGetClockInfo(hb, pynvml.NVML_CLOCK_GRAPHICS) == 1500
    a.nvmlDeviceResetGpuLockedClocks(ha)
    assert b.nvmlDeviceGetClockInfo(hb, pynvml.NVML_CLOCK_GRAPHICS) == 345


def test_clock_offsets_struct_api_on_geforce(rtx, nvml_of):
    nv = nvml_of(rtx)
    h = nv.nvmlDeviceGetHandleByIndex(0)
    info = pynvml.c_nvmlClockOffset_t()
    info.version, info.type, info.pstate = pynvml.nvmlClockOffset_v1, pynvml.NVML_CLOCK_GRAPHICS, 0
    assert nv.nvmlDeviceGetClockOffsets(h, ctypes.byref(info)) == 0
    assert (info.minClockOffsetMHz, info.maxClockOffsetMHz, info.clockOffsetMHz) == (-1000, 1500, 0)
    info.clockOffsetMHz = 120
    nv.nvmlDeviceSetClockOffsets(h, ctypes.byref(info))
    assert nv.nvmlDeviceGetGpcClkVfOffset(h) == 120
    info.clockOffsetMHz = 5000  # out of range: silently ignored, as nvidia-ml-py does
    assert nv.nvmlDeviceSetClockOffsets(h, ctypes.byref(info)) == 0
    assert nv.nvmlDeviceGetGpcClkVfOffset(h) == 120
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nv.nvmlDeviceGetApplicationsClock(h, pynvml.NVML_CLOCK_GRAPHICS)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nv.nvmlDeviceGetRemappedRows(h)


def test_vm_host_is_read_only(tmp_path, nvml_of):
    root = make_host(tmp_path, vm=True)
    nv = nvml_of(root)
    h = nv.nvmlDeviceGetHandleByIndex(0)
    assert nv.nvmlDeviceGetVirtualizationMode(h) == pynvml.NVML_GPU_VIRTUALIZATION_MODE_PASSTHROUGH
    for call in (lambda: nv.nvmlDeviceSetPowerManagementLimit(h, 600000),
                 lambda: nv.nvmlDeviceSetGpuLockedClocks(h, 1500, 1500),
                 lambda: nv.nvmlDeviceSetPersistenceMode(h, 0),
                 lambda: nv.nvmlDeviceSetApplicationsClocks(h, 3201, 1500)):
        with pytest.raises(pynvml.NVMLError_NoPermission):
            call()
    nv.nvmlDeviceSetPowerManagementLimit_v2(h, 0, 600000)  # silent, and nothing changes
    assert nv.nvmlDeviceGetPowerManagementLimit(h) == 700000
    assert " hypervisor " in (root / "proc" / "cpuinfo").read_text()
    assert nv.nvmlDeviceGetPciInfo(h).busId == "00000000:00:06.0"  # as in the probed VM


def test_event_set_delivers_xids_injected_by_another_process(h200, nvml_of):
    nv = nvml_of(h200)
    h = nv.nvmlDeviceGetHandleByIndex(0)
    inject(h200, "xid", ["31"])  # before registration: not delivered, as on real NVML
    es = nv.nvmlEventSetCreate()
    nv.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, es)
    t0 = time.monotonic()
    with pytest.raises(pynvml.NVMLError_Timeout):
        nv.nvmlEventSetWait_v2(es, 100)
    assert time.monotonic() - t0 >= 0.09
    subprocess.run([sys.executable, "-m", "tuner", "sim", "inject", str(h200), "xid", "79"],
                   check=True, capture_output=True)
    d = nv.nvmlEventSetWait_v2(es, 2000)
    assert isinstance(d, pynvml.c_nvmlEventData_t)
    assert d.eventType == pynvml.nvmlEventTypeXidCriticalError and d.eventData == 79
    assert nv.nvmlDeviceGetIndex(d.device) == 0
    inject(h200, "ecc-dbe")  # DBE event is not registered here; its Xid 94 and 63 are
    assert [nv.nvmlEventSetWait(es, 500).eventData for _ in range(2)] == [94, 63]
    with pytest.raises(pynvml.NVMLError_Timeout):
        nv.nvmlEventSetWait(es, 0)
    nv.nvmlEventSetFree(es)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nv.nvmlEventSetWait(es, 0)
    kmsg = (h200 / "dev" / "kmsg").read_text().splitlines()
    assert any("NVRM: Xid (PCI:0000:18:00): 79, " in line for line in kmsg)
    assert nv.nvmlDeviceGetTotalEccErrors(h, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                          pynvml.NVML_VOLATILE_ECC) == 1
    assert nv.nvmlDeviceGetRemappedRows(h) == (0, 1, 1, 0)
    with pytest.raises(pynvml.NVMLError_NotSupported):  # GPU supports only some event types
        nv.nvmlDeviceRegisterEvents(h, 0x20, nv.nvmlEventSetCreate())


def test_state_json_is_plain_and_atomic(h200):
    st = json.loads((h200 / "nvml" / "state.json").read_text())
    assert st["sku"] == "h200" and st["gpus"][0]["power_limit_mw"] == 700000
    assert not list((h200 / "nvml").glob(".*.tmp"))


def test_tenant_busy_and_idle_for_idle_detection(h200, nvml_of):
    import os

    from tuner.errors import BadInput

    nv = nvml_of(h200)
    h = nv.nvmlDeviceGetHandleByIndex(0)
    inject(h200, "busy", [str(os.getpid())])
    assert nv.nvmlDeviceGetUtilizationRates(h).gpu == 100
    assert [p.pid for p in nv.nvmlDeviceGetComputeRunningProcesses(h)] == [os.getpid()]
    inject(h200, "idle")
    assert nv.nvmlDeviceGetUtilizationRates(h).gpu == 0
    assert nv.nvmlDeviceGetComputeRunningProcesses(h) == []
    with pytest.raises(BadInput, match="no process"):
        inject(h200, "busy", ["999999"])
