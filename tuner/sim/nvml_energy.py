"""The fake NVML's power and energy readings (nvmlDeviceGetPowerUsage,
nvmlDeviceGetTotalEnergyConsumption), as a mixin of `tuner.sim.fake_pynvml.FakeNVML`, both from
the one model in tuner/sim/power.py so that an energy counter read over a window and power
samples integrated over it agree."""
from __future__ import annotations

from typing import Any

import pynvml

from tuner.sim import power
from tuner.sim.nvml_clocks import nvml_error


class EnergyMixin:
    _gpu: Any
    _busy: Any

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        g, _, sku = self._gpu(handle)
        return int(power.current_power(g, sku, self._busy(g)) * 1000)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        g, _, sku = self._gpu(handle)
        if g.get("energy_counter") is False:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return power.counter(g, sku, self._busy(g))
