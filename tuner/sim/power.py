"""Board power and energy of a simulated GPU: what the sim workload reports as tokens/J and mean
watts, and what the fake NVML's power reading and total-energy counter show.

Power while the workload runs is `model.power_w` at the clock the performance model settles on
(from the locked clocks, the power limit, the memory clock and the V/F curve; capped at the
limit, held at the thermal threshold when hot), scaled by utilisation between the idle draw and
that full draw:

    P = P_idle + u * (P_model - P_idle)          (u = 1 for the sim workload: decode is busy)

Calibration (the constants live in tuner/sim/skus.py):
- H200: power limit 200-700 W, default 700 W = the H200 SXM TDP (NVIDIA H200 Tensor Core GPU
  datasheet, "Max thermal design power up to 700 W"; NVML's constraints read on the lent H200,
  docs/readings/h200-probe-2026-11-29.json: power_constraints_mw [200000, 700000]); idle 86.8 W
  (the same probe, power_usage_mw 86848); memory power ~50-90 W (the probe's "GPU Memory Power
  Readings, Average Power Draw 52.04 W" near idle; p_mem_top_w 90 W under load). MLA decode at
  stock draws 684-720 W dense and 200-520 W sparse (docs/readings/h200-mla-energy-2026-12-02.md):
  a fully busy decode runs at the power limit, which the model reproduces (full draw above the
  limit at the top clock, so the boost controller caps it: `regime` power_capped).
- RTX 4090: 450 W default, 150-600 W limits, ~21 W idle (its public specs and NVML on one).
- Shape of throughput against power: Zeus (You et al., NSDI'23, Fig. 2/4) and Perseus (Chung et
  al., SOSP'24) measure that lowering the power limit or locking a lower SM clock costs little
  throughput until the clock falls below the V/F knee, while power falls with f*V(f)^2: the
  tokens/J optimum sits well below the TDP (Zeus: 10-30% less energy for a few percent of
  time). The model's V(f) (`v_gamma`: voltage rises steeply near the top clock) gives that
  shape; `tests/sim/test_power.py` checks its monotonicity and calibration points.

The energy counter (nvmlDeviceGetTotalEnergyConsumption, mJ since the driver loaded) is the
integral over wall time of the power `nvmlDeviceGetPowerUsage` reports: the modelled draw while
a workload run is seen busy, idle draw otherwise; the workload folds the counter at every change
of that state (`fold`), so an NVML reader (kernelsearch.energy.EnergyMeter) gets from the counter
what it would get from integrating the power samples. A sim run completes in microseconds, so
its own energy is reported from the model (energy_source "sim_model": tokens/s over the
modelled watts), not read back from the counter. The counter wraps at `wrap_mj` (2^64 as NVML's
unsigned long long; a test sets a small one). A GPU whose state says `energy_counter: false`
answers NotSupported, as GPUs before Volta and some vGPU profiles do; readers fall back to
integrating power samples.
"""
from __future__ import annotations

import time
from typing import Any, Optional

from tuner.sim.skus import Sku

WRAP_MJ = 1 << 64  # NVML's counter is an unsigned long long


def board_power(sku: Sku, model_w: float, utilisation: float = 1.0) -> float:
    """Mean board watts at `utilisation` (0..1) of a run whose full draw is `model_w`."""
    u = min(max(utilisation, 0.0), 1.0)
    return sku.idle_power_w + u * max(model_w - sku.idle_power_w, 0.0)


def current_power(g: dict[str, Any], sku: Sku, busy: bool) -> float:
    """What the board draws now: the running workload's modelled draw, else idle."""
    if busy and g.get("last_run"):
        return float(g["last_run"]["power_w"])
    return float(sku.idle_power_w)


def energy_now(g: dict[str, Any], sku: Sku, busy: bool, now: Optional[float] = None) -> float:
    """The counter's unwrapped value in mJ at `now`: what was folded in, plus the present draw
    since then."""
    now = time.time() if now is None else now
    since = float(g.get("energy_t") or now)
    return float(g.get("energy_mj", 0.0)) + current_power(g, sku, busy) * max(now - since, 0.0) * 1000.0


def fold(g: dict[str, Any], sku: Sku, busy: bool, now: Optional[float] = None) -> None:
    """Fold the energy since the last fold into the counter (under the state lock), before the
    GPU's busy state or running draw changes."""
    now = time.time() if now is None else now
    g["energy_mj"] = energy_now(g, sku, busy, now)
    g["energy_t"] = now


def counter(g: dict[str, Any], sku: Sku, busy: bool, now: Optional[float] = None) -> int:
    """nvmlDeviceGetTotalEnergyConsumption's value: mJ, wrapped."""
    wrap = int(g.get("energy_wrap_mj") or WRAP_MJ)
    return int(energy_now(g, sku, busy, now)) % wrap
