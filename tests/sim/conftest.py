from __future__ import annotations

import pytest

from tuner.sim.fake_pynvml import FakeNVML
from tuner.sim.hostinit import init_host


def make_host(tmp_path, sku="h200", vm=False, gpus=1, seed=0, name=None):
    # GPU-side tests: without the CPU/OS tree (tuner.sim.ostree), which only costs start-up time
    return init_host(tmp_path / (name or f"{sku}{'-vm' if vm else ''}-{gpus}-{seed}"), sku,
                     vm=vm, gpus=gpus, seed=seed, os_tree=False)


@pytest.fixture
def h200(tmp_path):
    return make_host(tmp_path, "h200")


@pytest.fixture
def rtx(tmp_path):
    return make_host(tmp_path, "rtx4090")


@pytest.fixture
def nvml_of():
    opened = []

    def _open(root):
        nv = FakeNVML(root)
        nv.nvmlInit()
        opened.append(nv)
        return nv

    yield _open
    for nv in opened:
        try:
            nv.nvmlShutdown()
        except Exception:
            pass
