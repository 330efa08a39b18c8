"""Performance, power, thermal and instability model of a simulated GPU.

A mixed inference workload: a share of its time scales with the graphics clock, the rest with the
memory clock (roofline-style). Power = static + memory (∝ memory clock) + dynamic ∝ f·V(f)², where
V rises steeply near the top of the V/F curve (a GPC offset lowers the voltage a clock needs).
Temperature settles at ambient + R·P; above the slowdown threshold the HW slowdown duty-cycles the
clock down to hold the threshold, which costs far more than the power it sheds.

Regimes for a clock lock [lo, hi] (unlocked = [min, app/boost ceiling]) under power limit L:
- P(hi) <= L: runs at hi.
- P(lo) <= L < P(hi): the boost controller hunts for the clock that fits L (dither loss, SW power cap).
- P(lo) > L, within `unstable_over`: the power brake holds the clock below the lock (big penalty).
- P(lo) > L by more: unstable (voltage droop under a forced V/F point): Xid 79/62 or a hang.
GPC/memory offsets above the chip's (seeded) stable margin raise Xid 13/43 (31) or hang.

Everything is numpy-vectorised so `optimum` can brute-force the knob domains.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tuner.sim.skus import Sku, get_sku

# NVML clocks event reason bits (pynvml.nvmlClocksEventReason*)
GPU_IDLE = 0x1
APP_CLOCKS = 0x2
SW_POWER_CAP = 0x4
HW_SLOWDOWN = 0x8
HW_THERMAL = 0x40
HW_POWER_BRAKE = 0x80

POWER_XIDS = (79, 62)  # fallen off the bus, internal micro-controller halt
GPC_OFFSET_XIDS = (13, 43)  # graphics engine exception, GPU stopped processing
MEM_OFFSET_XIDS = (13, 31)  # graphics engine exception, MMU fault
NOISE_SIGMA = 0.02


@dataclass
class Outcome:
    throughput: float  # noise-free
    clock_mhz: int
    mem_clock_mhz: int
    power_w: float
    temp_c: float
    reasons: int
    xid_prob: float
    hang_prob: float
    xid_choices: tuple[int, ...] = ()
    regime: str = "ok"
    extra: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------
# physics (numpy, broadcasting)


def voltage(sku: Sku, f_v: Any) -> Any:
    x = np.clip((np.asarray(f_v, dtype=float) - sku.gr_min) / (sku.gr_max - sku.gr_min), 0.0, 1.4)
    return sku.v_min + (sku.v_max - sku.v_min) * x ** sku.v_gamma


def power_w(sku: Sku, f: Any, m: Any, gpc_off: Any = 0) -> Any:
    f = np.asarray(f, dtype=float)
    dyn = sku.p_dyn_top_w * (f / sku.gr_max) * (voltage(sku, f - gpc_off) / sku.v_max) ** 2
    return sku.p_static_w + sku.p_mem_top_w * (np.asarray(m, dtype=float) / sku.mem_top) + dyn


def speed(sku: Sku, f: Any, m: Any) -> Any:
    """Relative throughput (1.0 at the top graphics and memory clocks)."""
    c = sku.compute_fraction
    return 1.0 / (c * sku.gr_max / np.asarray(f, dtype=float)
                  + (1 - c) * sku.mem_top / np.asarray(m, dtype=float))


def _floor_grid(sku: Sku, f: Any) -> Any:
    return sku.gr_min + np.floor((np.asarray(f, dtype=float) - sku.gr_min) / sku.gr_step + 1e-9) * sku.gr_step


def fit_clock(sku: Sku, limit_w: Any, m: Any, gpc_off: Any) -> Any:
    """Highest clock (continuous, >= gr_min) whose power fits the limit; power rises with f, so a
    bisection over the shape of (limit, memory, offset) only, not over every clock choice."""
    lo = np.full(np.broadcast(limit_w, m, gpc_off).shape, float(sku.gr_min))
    hi = np.full(lo.shape, float(sku.gr_max + max(sku.gpc_offset_range[1], 0)))
    for _ in range(22):
        mid = (lo + hi) / 2
        ok = power_w(sku, mid, m, gpc_off) <= limit_w
        lo = np.where(ok, mid, lo)
        hi = np.where(ok, hi, mid)
    return lo


def core(sku: Sku, lock_lo: Any, lock_hi: Any, limit_w: Any, mem: Any, gpc_off: Any,
         mem_off: Any, gpc_margin: int, mem_margin: int) -> dict[str, Any]:
    """The model on arrays. lock_lo/lock_hi already resolved (unlocked = [min, ceiling])."""
    lo, hi = np.asarray(lock_lo, dtype=float), np.asarray(lock_hi, dtype=float)
    L = np.asarray(limit_w, dtype=float)
    m = np.asarray(mem, dtype=float)
    m_eff = np.maximum(m + mem_off, 0.5 * m)
    p_hi = power_w(sku, hi, m_eff, gpc_off)
    p_lo = power_w(sku, lo, m_eff, gpc_off)
    f_fit = np.maximum(_floor_grid(sku, np.minimum(fit_clock(sku, L, m_eff, gpc_off), hi)), sku.gr_min)

    fits = p_hi <= L
    capped = ~fits & (p_lo <= L)
    over = p_lo / L - 1.0
    brake = ~fits & ~capped & (over <= sku.unstable_over)
    unstable = ~fits & ~capped & ~brake

    # unstable: the brake fights the forced V/F point, so even a run without an Xid is slow
    f_run = np.select([fits, capped], [hi, np.maximum(f_fit, lo)], default=f_fit)
    mult = np.select([capped, brake, unstable],
                     [1.0 - sku.dither_loss, sku.brake_penalty, 0.9 * sku.brake_penalty], default=1.0)
    p_run = np.select([fits, capped | brake], [p_hi, L], default=p_lo)
    reasons = np.select(
        [fits, capped, brake],
        [0, SW_POWER_CAP, SW_POWER_CAP | HW_SLOWDOWN | HW_POWER_BRAKE],
        default=SW_POWER_CAP | HW_POWER_BRAKE,
    ).astype(np.int64)
    reasons = np.where(fits & (hi < sku.gr_max), reasons | APP_CLOCKS, reasons)

    # thermal: above the safe power the HW slowdown duty-cycles the clock to hold the threshold
    p_safe = (sku.temp_slowdown - sku.t_ambient) / sku.r_thermal
    hot = p_run > p_safe
    p_slow = power_w(sku, f_run * sku.slowdown_clock_frac, m_eff, gpc_off)
    duty = np.clip((p_run - p_safe) / np.maximum(p_run - p_slow, 1e-6), 0.0, 1.0)
    mult = np.where(hot, mult * (1.0 - duty * (1.0 - sku.slowdown_efficiency)), mult)
    temp = np.where(hot, sku.temp_slowdown + 1.0, sku.t_ambient + sku.r_thermal * p_run)
    p_avg = np.where(hot, p_safe, p_run)
    reasons = np.where(hot, reasons | HW_SLOWDOWN | HW_THERMAL, reasons)

    thr = sku.base_throughput * speed(sku, f_run, m_eff) * mult

    # instability
    xid_p = np.where(unstable, np.clip(0.6 + 4.0 * (over - sku.unstable_over), 0.0, 0.95), 0.0)
    hang_p = np.where(unstable, 0.15, 0.0)
    g_ex = np.asarray(gpc_off, dtype=float) - gpc_margin
    gpc_bad = g_ex > 0
    xid_p = np.where(gpc_bad, np.maximum(xid_p, np.clip(0.5 + g_ex / 50.0, 0.0, 0.95)), xid_p)
    hang_p = np.where(gpc_bad, np.maximum(hang_p, 0.1), hang_p)
    m_ex = np.asarray(mem_off, dtype=float) - mem_margin
    mem_bad = m_ex > 0
    xid_p = np.where(mem_bad, np.maximum(xid_p, np.clip(0.4 + m_ex / 300.0, 0.0, 0.9)), xid_p)
    return {"throughput": thr, "clock": f_run, "mem_clock": m_eff, "power": p_avg, "temp": temp,
            "reasons": reasons, "xid_p": xid_p, "hang_p": hang_p, "unstable": unstable,
            "brake": brake, "capped": capped, "hot": hot, "gpc_bad": gpc_bad, "mem_bad": mem_bad}


# ---------------------------------------------------------------------------------------------
# on a GPU's state (the dicts in DIR/nvml/state.json)


def chip_params(sku: Sku, seed: int, index: int) -> dict[str, int]:
    """Per-chip stable offset margins: silicon lottery, fixed by the host seed."""
    rng = random.Random(f"metaltune-sim:{seed}:{index}:margin")
    g0, g1 = sku.gpc_margin_range
    m0, m1 = sku.mem_margin_range
    return {"gpc_margin": rng.randint(g0, g1) if g1 else 0,
            "mem_margin": rng.randint(m0, m1) if m1 else 0}


def resolve(sku: Sku, gpu: dict[str, Any]) -> dict[str, Any]:
    """Knob state of one GPU → model inputs."""
    gpc_off = int(gpu.get("gpc_offset", 0))
    lock = gpu.get("locked_gr")
    app_gr = gpu.get("app_gr") or sku.gr_max
    if lock:
        lo, hi = int(lock[0]), int(lock[1])
    else:
        lo, hi = sku.gr_min, app_gr + gpc_off
    mlock = gpu.get("locked_mem")
    mem = int(mlock[1]) if mlock else int(gpu.get("app_mem") or sku.mem_top)
    return {"lock_lo": lo, "lock_hi": hi, "limit_w": gpu["power_limit_mw"] / 1000.0, "mem": mem,
            "gpc_off": gpc_off, "mem_off": int(gpu.get("mem_offset", 0))}


def evaluate(sku: Sku | str, gpu: dict[str, Any]) -> Outcome:
    sku = get_sku(sku) if isinstance(sku, str) else sku
    chip = gpu.get("chip") or {"gpc_margin": 0, "mem_margin": 0}
    r = core(sku, **resolve(sku, gpu), gpc_margin=chip["gpc_margin"], mem_margin=chip["mem_margin"])
    inj = gpu.get("injected") or {}
    thr = float(r["throughput"])
    reasons = int(r["reasons"])
    temp = float(r["temp"])
    regime = ("unstable" if r["unstable"] else "power_brake" if r["brake"] else
              "power_capped" if r["capped"] else "ok")
    if r["hot"]:
        regime += "+thermal_slowdown"
    if inj.get("thermal"):
        thr *= 0.6
        reasons |= HW_SLOWDOWN | HW_THERMAL
        temp = max(temp, sku.temp_slowdown + 3.0)
    if inj.get("power_brake"):
        thr *= 0.5
        reasons |= HW_SLOWDOWN | HW_POWER_BRAKE
    choices: tuple[int, ...] = ()
    if r["unstable"]:
        choices = POWER_XIDS
    elif r["gpc_bad"]:
        choices = GPC_OFFSET_XIDS
    elif r["mem_bad"]:
        choices = MEM_OFFSET_XIDS
    return Outcome(throughput=thr, clock_mhz=int(r["clock"]), mem_clock_mhz=int(r["mem_clock"]),
                   power_w=float(r["power"]), temp_c=round(temp, 1), reasons=reasons,
                   xid_prob=float(r["xid_p"]), hang_prob=float(r["hang_p"]), xid_choices=choices,
                   regime=regime)


def true_throughput(state: dict[str, Any]) -> float:
    """Noise-free throughput of the host (sum over its GPUs) for a loaded state.json dict."""
    sku = get_sku(state["sku"])
    return float(sum(evaluate(sku, g).throughput for g in state["gpus"])
                 * float(state.get("boot_factor", 1.0)))


def default_gpu_settings(sku: Sku) -> dict[str, Any]:
    return {"power_limit_mw": sku.power_default_w * 1000, "locked_gr": None, "locked_mem": None,
            "app_gr": None, "app_mem": None, "gpc_offset": 0, "mem_offset": 0}


def baseline(sku: Sku | str, chip: dict[str, int] | None = None) -> float:
    sku = get_sku(sku) if isinstance(sku, str) else sku
    return evaluate(sku, {**default_gpu_settings(sku), "chip": chip}).throughput


# ---------------------------------------------------------------------------------------------
# brute-force optimum over the knob domains


def optimum(sku: Sku | str, chip: dict[str, int] | None = None, power_step_w: int = 10,
            gpc_offset_step: int = 15, mem_offset_step: int = 100,
            include_offsets: bool = True, allow_slowdown: bool = False) -> dict[str, Any]:
    """Best stable noise-free throughput of one GPU over: locked clocks (unlocked or pinned at each
    supported clock) × locked memory clock (unlocked or each supported) × power limit (its knob's
    grid) × GPC/memory offsets (their knob grids, where supported). Settings that can raise an Xid
    or hang are excluded, and (unless allow_slowdown) so are those running in HW thermal slowdown
    or power brake, which health monitors treat as incidents. Ties go to the lowest power limit
    (the most efficient setting)."""
    sku = get_sku(sku) if isinstance(sku, str) else sku
    chip = chip or {"gpc_margin": 0, "mem_margin": 0}
    clocks = np.array([0] + sorted(sku.graphics_clocks()), dtype=float)  # 0 = unlocked
    mems = np.array(sorted(sku.mem_clocks), dtype=float)  # unlocked == the top clock
    powers = np.arange(sku.power_min_w, sku.power_max_w + 1, power_step_w, dtype=float)
    g0, g1 = sku.gpc_offset_range
    m0, m1 = sku.mem_offset_range
    gpcs = np.arange(_grid_start(g0, gpc_offset_step), g1 + 1, gpc_offset_step) if (
        include_offsets and (g0, g1) != (0, 0)) else np.array([0])
    memoffs = np.arange(_grid_start(m0, mem_offset_step), m1 + 1, mem_offset_step) if (
        include_offsets and (m0, m1) != (0, 0)) else np.array([0])
    # offsets above the chip's stable margin always carry an Xid risk: excluded without evaluating
    gpcs = gpcs[gpcs <= max(chip["gpc_margin"], 0)]
    memoffs = memoffs[memoffs <= max(chip["mem_margin"], 0)]
    C = clocks[:, None, None, None]
    M = mems[None, :, None, None]
    P = powers[None, None, :, None]
    G = gpcs.astype(float)[None, None, None, :]
    shape = (len(clocks), len(mems), len(powers), len(gpcs))
    lo = np.where(C == 0, sku.gr_min, C)
    hi = np.where(C == 0, sku.gr_max + G, C)
    best: dict[str, Any] = {"throughput": -1.0}
    for mo in memoffs:
        r = core(sku, lo, hi, P, M, G, float(mo), chip["gpc_margin"], chip["mem_margin"])
        bad = (r["xid_p"] > 0) | (r["hang_p"] > 0)
        if not allow_slowdown:
            bad = bad | r["hot"] | r["brake"]
        thr = np.where(bad, -1.0, r["throughput"])
        # lexicographic: max throughput, then lowest power limit
        top = thr.max()
        if top < best["throughput"] - 1e-9:
            continue
        thr = np.broadcast_to(thr, shape)
        cand = np.argwhere(thr >= top - 1e-9)
        ix = tuple(min(cand, key=lambda i: (powers[i[2]], -clocks[i[0]])))
        c, mem, pw, g = int(clocks[ix[0]]), int(mems[ix[1]]), int(powers[ix[2]]), int(gpcs[ix[3]])
        if top > best["throughput"] + 1e-9 or pw < best["settings"]["power_limit_w"]:
            at = {k: float(np.broadcast_to(r[k], shape)[ix]) for k in ("clock", "power", "temp")}
            best = {"throughput": float(top), "settings": {
                "locked_clocks_mhz": None if c == 0 else [c, c],
                "locked_mem_clocks_mhz": [mem, mem],
                "power_limit_w": pw,
                "gpc_clock_offset_mhz": g,
                "mem_clock_offset_mhz": int(mo)},
                "clock_mhz": int(at["clock"]), "power_draw_w": round(at["power"], 1),
                "temp_c": round(at["temp"], 1)}
    return best


def _grid_start(lo: int, step: int) -> int:
    """First grid point >= lo on a grid through 0."""
    return -((-lo) // step) * step if lo < 0 else lo


def summary(sku_name: str, seed: int = 0) -> dict[str, Any]:
    sku = get_sku(sku_name)
    chip = chip_params(sku, seed, 0)
    base = evaluate(sku, {**default_gpu_settings(sku), "chip": chip})
    best = optimum(sku, chip)
    return {"sku": sku.name, "seed": seed, "chip": chip, "unit": sku.unit,
            "baseline": {"throughput": round(base.throughput, 1), "clock_mhz": base.clock_mhz,
                         "power_w": round(base.power_w, 1), "temp_c": base.temp_c,
                         "regime": base.regime},
            "optimum": best, "gain": round(best["throughput"] / base.throughput - 1, 4)}

