"""The simulated host's state survives the death of any process and is shared between processes."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from tests.sim.conftest import make_host
from tuner.sim.fake_pynvml import FakeNVML

WRITER = r"""
import sys
from tuner.sim.fake_pynvml import FakeNVML
nv = FakeNVML(sys.argv[1]); nv.nvmlInit()
h = nv.nvmlDeviceGetHandleByIndex(0)
nv.nvmlDeviceSetPowerManagementLimit(h, 450000)
nv.nvmlDeviceSetGpuLockedClocks(h, 1500, 1500)
print("ready", flush=True)
i = 0
while True:  # keep rewriting the state until killed
    nv.nvmlDeviceSetPowerManagementLimit(h, 300000 + 10000 * (i % 20))
    i += 1
"""


def test_state_survives_sigkill_mid_write(tmp_path):
    root = make_host(tmp_path)
    p = subprocess.Popen([sys.executable, "-c", WRITER, str(root)], stdout=subprocess.PIPE,
                         text=True, cwd=os.getcwd())
    try:
        assert p.stdout.readline().strip() == "ready"
        time.sleep(0.3)  # let it write many times, then kill it at an arbitrary instant
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    assert p.returncode == -signal.SIGKILL
    json.loads((root / "nvml" / "state.json").read_text())  # never torn
    nv = FakeNVML(root)
    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(0)
    assert nv.nvmlDeviceGetPowerManagementLimit(h) in range(300000, 500001, 10000)
    assert nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_GRAPHICS) == 1500  # the lock is still there
    # the dead writer's lock is released by the kernel: a new write goes through at once
    nv.nvmlDeviceSetPowerManagementLimit(h, 650000)
    assert FakeNVML(root)._state.read()["gpus"][0]["power_limit_mw"] == 650000
