"""Contract: every NVML function FakeNVML implements exists in nvidia-ml-py (the installed `pynvml`)
with the same parameter names, order, kinds and defaults, so knob code written against the fake
runs on real hardware."""
from __future__ import annotations

import ctypes
import inspect

import pynvml
import pytest

from tuner.sim.fake_pynvml import FakeNVML

# its own and its mixins' (tuner/sim/nvml_clocks.py)
FAKE_FUNCS = sorted(n for n in dir(FakeNVML) if n.startswith("nvml") and callable(getattr(FakeNVML, n)))


def _default(v):
    # ctypes scalars compare by identity; compare their type and value instead
    if isinstance(v, ctypes._SimpleCData):
        return (type(v).__name__, v.value)
    return v


def _params(fn, drop_self: bool):
    ps = list(inspect.signature(fn).parameters.values())
    if drop_self:
        ps = ps[1:]
    return [(p.name, p.kind, _default(p.default)) for p in ps]


def test_fake_covers_the_functions_the_knobs_and_monitors_need():
    needed = {
        "nvmlInit", "nvmlShutdown", "nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex",
        "nvmlDeviceGetHandleByUUID", "nvmlDeviceGetHandleByPciBusId", "nvmlDeviceGetPciInfo",
        "nvmlDeviceSetPowerManagementLimit", "nvmlDeviceSetPowerManagementLimit_v2",
        "nvmlDeviceGetPowerManagementLimitConstraints", "nvmlDeviceSetGpuLockedClocks",
        "nvmlDeviceSetMemoryLockedClocks", "nvmlDeviceGetClockOffsets", "nvmlDeviceSetClockOffsets",
        "nvmlDeviceGetGpcClkMinMaxVfOffset", "nvmlDeviceSetGpcClkVfOffset",
        "nvmlDeviceGetCurrentClocksEventReasons", "nvmlEventSetCreate", "nvmlDeviceRegisterEvents",
        "nvmlEventSetWait_v2", "nvmlEventSetFree", "nvmlDeviceGetTotalEccErrors",
        "nvmlDeviceGetRemappedRows", "nvmlDeviceGetPcieReplayCounter",
        "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetComputeRunningProcesses",
        "nvmlDeviceGetVirtualizationMode", "nvmlDeviceSetPersistenceMode",
    }
    assert needed <= set(FAKE_FUNCS)
    assert len(FAKE_FUNCS) >= 70


@pytest.mark.parametrize("name", FAKE_FUNCS)
def test_same_signature_as_nvidia_ml_py(name):
    real = getattr(pynvml, name, None)
    assert real is not None, f"{name} is not in nvidia-ml-py {pynvml.__file__}"
    assert _params(getattr(FakeNVML, name), drop_self=True) == _params(real, drop_self=False)


def test_unimplemented_functions_fail_loudly_and_constants_pass_through(tmp_path):
    nv = FakeNVML(tmp_path)
    assert nv.NVML_CLOCK_GRAPHICS == pynvml.NVML_CLOCK_GRAPHICS
    assert nv.NVMLError_NotSupported is pynvml.NVMLError_NotSupported
    with pytest.raises(AttributeError, match="does not implement"):
        nv.nvmlDeviceGetNvLinkState
