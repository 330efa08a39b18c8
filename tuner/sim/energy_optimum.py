"""Brute force over a simulated GPU's (power limit x locked SM clock x memory clock) grid for the
most tokens per joule: the yardstick `search host --objective energy` is measured against
(benchmarks/bench_energy_objective.py, tests/sim/test_power.py).

The grid is the knobs' own search grid (power limit in 10 W steps between `power_min_w` and the
maximum, each supported graphics clock pinned or unlocked, each memory clock), with the
settings a search cannot keep left out: unstable ones (an Xid or hang risk) and those in HW
thermal slowdown or power brake (health monitors roll them back). `floor`: the throughput must
stay at least that fraction of the driver defaults' (the run's start), as the energy
objective's floor asks.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from tuner.sim import model
from tuner.sim.skus import Sku, get_sku


def grid(sku: Sku | str, chip: Optional[dict[str, int]] = None, power_min_w: Optional[int] = None,
         power_step_w: int = 10) -> dict[str, Any]:
    """Every grid point's noise-free throughput, board watts, tokens/J and whether a search
    could keep it (`ok`), as arrays indexed [clock, memory clock, power limit]."""
    sku = get_sku(sku) if isinstance(sku, str) else sku
    chip = chip or {"gpc_margin": 0, "mem_margin": 0}
    clocks = np.array([0] + sorted(sku.graphics_clocks()), dtype=float)  # 0 = unlocked
    mems = np.array(sorted(sku.mem_clocks), dtype=float)
    powers = np.arange(power_min_w or sku.power_min_w, sku.power_max_w + 1, power_step_w, dtype=float)
    C, M, P = clocks[:, None, None], mems[None, :, None], powers[None, None, :]
    lo = np.where(C == 0, sku.gr_min, C)
    hi = np.where(C == 0, sku.gr_max, C)
    r = model.core(sku, lo, hi, P, M, 0.0, 0.0, chip["gpc_margin"], chip["mem_margin"])
    shape = (len(clocks), len(mems), len(powers))
    thr = np.broadcast_to(r["throughput"], shape)
    watts = np.broadcast_to(r["power"], shape)
    ok = ~np.broadcast_to((r["xid_p"] > 0) | (r["hang_p"] > 0) | r["hot"] | r["brake"], shape)
    return {"clocks": clocks, "mems": mems, "powers": powers, "throughput": thr, "watts": watts,
            "tok_per_j": thr / watts, "ok": ok}


def settings_at(g: dict[str, Any], ix: tuple[int, int, int]) -> dict[str, Any]:
    c, m, p = int(g["clocks"][ix[0]]), int(g["mems"][ix[1]]), int(g["powers"][ix[2]])
    return {"locked_clocks_mhz": None if c == 0 else [c, c], "locked_mem_clocks_mhz": [m, m],
            "power_limit_w": p}


def energy_optimum(sku: Sku | str, chip: Optional[dict[str, int]] = None, floor: float = 0.95,
                   power_min_w: Optional[int] = None) -> dict[str, Any]:
    """The most tokens/J on the grid with throughput >= floor x the defaults' (ties: the most
    throughput), and the defaults' own numbers."""
    sku = get_sku(sku) if isinstance(sku, str) else sku
    base = model.evaluate(sku, {**model.default_gpu_settings(sku), "chip": chip})
    g = grid(sku, chip, power_min_w)
    good = g["ok"] & (g["throughput"] >= floor * base.throughput)
    tpj = np.where(good, g["tok_per_j"], -1.0)
    top = tpj.max()
    cand = np.argwhere(tpj >= top * (1 - 1e-9))
    ix = tuple(max(cand, key=lambda i: g["throughput"][tuple(i)]))
    return {"tok_per_j": float(top), "throughput": float(g["throughput"][ix]),
            "watts": float(g["watts"][ix]), "settings": settings_at(g, ix),
            "points": int(good.sum()), "grid_points": int(g["ok"].size),
            "baseline": {"tok_per_j": base.throughput / base.power_w,
                         "throughput": base.throughput, "watts": base.power_w,
                         "regime": base.regime}}
