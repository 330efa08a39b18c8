"""Benchmark numbers for a simulated host (`sim://DIR`), derived from the sim's own state and
model, so that two simulated hosts compare the way real ones would.

Assumptions (documented, not measured; change them here only with a reason):
- Bare-metal base figures per SKU. For `h200` they are the readings in docs/readings (taken in a
  Firecracker VM with the GPU passed through) with the VM effects below taken out; for `rtx4090`
  they are plausible desktop figures (PCIe Gen4 x16, no NVLink).
- Through the sim's performance model (`tuner.sim.model.evaluate` of GPU 0's state against the same
  chip at default settings): GEMM scales with the effective graphics clock, device copy with the
  memory clock, the holistic decode with the model's workload throughput (so a profile that the
  model says is faster, or an injected thermal/power-brake slowdown, shows up here).
  Host<->device copies scale with the PCIe link the sim's sysfs shows (gen x width).
- Decode tokens/J base: decode_tok_s over the board's draw while decoding (H200: 9,060 tok/s at
  ~690 W, the 684-720 W the facts measured for dense MLA decode at the 700 W limit; RTX 4090:
  700 tok/s at ~400 W), scaled by the model's tokens/J now over the defaults'
  (tuner/sim/power.py).
- H200 decode base: the facts' 4-layer Llama-style decode at batch 8, 4k context (0.91 ms graph,
  2.95 ms eager, measured in the VM) with the VM factors below taken out.
- A VM (`--vm`, or the facts say vm) costs: eager launch latency x1.30 (guest exits on the
  doorbell path), graph launch x1.05, pageable copies x0.60 (guest page faults and no huge pages
  behind the staging copy), pinned copies x0.98, host memory bandwidth x0.92,
  graph decode x0.97, eager decode x0.80 (launch-bound: eager decode is 3.2x slower than graphs). GPU-bound work (GEMM, device copy) is unchanged by passthrough.
- Relaxed ordering off in the GPU's config space costs pinned copies x0.97.
- Measurement noise: Gaussian, 1.5% relative (3% for launch latency), seeded from `seed`.
"""
from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from tuner.compare.suite import METRICS, Config, Metric, new

NOTE = ("simulated host: numbers derived from the sim's state and performance model plus documented "
        "bare-metal/VM assumptions (tuner/compare/simbench.py), not measured")

BASE: dict[str, dict[str, float]] = {
    "h200": {
        "gemm_bf16_tflops": 702.0, "device_copy_tbps": 4.24,
        "h2d_pinned_gbps": 56.4, "d2h_pinned_gbps": 56.3,
        "h2d_pageable_gbps": 17.8, "d2h_pageable_gbps": 15.0,
        "launch_eager_us": 4.3, "launch_graph_us": 1.23,
        "nccl_allreduce_busbw_gbps": 360.0, "host_mem_bw_gbps": 20.0, "decode_tok_s": 9060.0,
        "decode_eager_tok_s": 3390.0, "decode_tok_per_j": 13.1, "pcie_gen": 5, "pcie_width": 16,
    },
    "rtx4090": {
        "gemm_bf16_tflops": 150.0, "device_copy_tbps": 0.91,
        "h2d_pinned_gbps": 25.5, "d2h_pinned_gbps": 26.0,
        "h2d_pageable_gbps": 13.0, "d2h_pageable_gbps": 11.0,
        "launch_eager_us": 3.9, "launch_graph_us": 1.15,
        "nccl_allreduce_busbw_gbps": 18.0, "host_mem_bw_gbps": 20.0, "decode_tok_s": 700.0,
        "decode_eager_tok_s": 330.0, "decode_tok_per_j": 1.75, "pcie_gen": 4, "pcie_width": 16,
    },
}
VM_FACTOR = {
    "launch_eager_us": 1.30, "launch_graph_us": 1.05,
    "h2d_pageable_gbps": 0.60, "d2h_pageable_gbps": 0.60,
    "h2d_pinned_gbps": 0.98, "d2h_pinned_gbps": 0.98,
    "host_mem_bw_gbps": 0.92, "decode_tok_s": 0.97, "decode_eager_tok_s": 0.80,
}
NO_RELAXED_ORDERING = {"h2d_pinned_gbps": 0.97, "d2h_pinned_gbps": 0.97}
COMPUTE = {"gemm_bf16_tflops"}
WORKLOAD = {"decode_tok_s", "decode_eager_tok_s"}
ENERGY = {"decode_tok_per_j"}
MEMORY = {"device_copy_tbps"}
LINK = {"h2d_pinned_gbps", "d2h_pinned_gbps", "h2d_pageable_gbps", "d2h_pageable_gbps"}
_GEN_GTS = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0, 6: 64.0}


def host_info(root: Path) -> dict[str, Any]:
    try:
        return json.loads((root / "host.json").read_text())
    except (OSError, ValueError):
        return {}


def model_factors(root: Path) -> dict[str, float]:
    """GPU 0 of the sim now, relative to the same chip at its default settings, through the sim's
    performance model: `compute` (graphics clock), `memory` (memory clock), `workload` (the
    model's mixed inference throughput). 1.0 each when the model cannot say."""
    ones = {"compute": 1.0, "memory": 1.0, "workload": 1.0, "energy": 1.0}
    try:
        from tuner.sim import model
    except ImportError:
        return ones
    try:
        state = json.loads((root / "nvml" / "state.json").read_text())
        sku = model.get_sku(state["sku"])
        gpu = state["gpus"][0]
        now = model.evaluate(sku, gpu)
        ref = model.evaluate(sku, {**model.default_gpu_settings(sku), "chip": gpu.get("chip")})
    except Exception:
        return ones
    return {"compute": now.clock_mhz / ref.clock_mhz if ref.clock_mhz else 1.0,
            "memory": now.mem_clock_mhz / ref.mem_clock_mhz if ref.mem_clock_mhz else 1.0,
            "workload": now.throughput / ref.throughput if ref.throughput else 1.0,
            "energy": (now.throughput / now.power_w) / (ref.throughput / ref.power_w)
            if ref.throughput and now.power_w and ref.power_w else 1.0}


def link_factor(facts: dict[str, Any], base: dict[str, float]) -> float:
    gen, width = facts.get("gpu0_pcie_gen"), facts.get("gpu0_pcie_width")
    if not gen or not width:
        return 1.0
    nominal = _GEN_GTS[int(base["pcie_gen"])] * base["pcie_width"]
    return min(1.0, _GEN_GTS.get(int(gen), nominal) * int(width) / nominal)


def run(host: Any, facts: dict[str, Any], cfg: Config, seed: int | None) -> list[Metric]:
    root = Path(host.root)
    info = host_info(root)
    sku = str(info.get("sku", "h200"))
    base = BASE.get(sku, BASE["h200"])
    vm = bool(info.get("vm")) or facts.get("virtualisation") == "vm"
    gpus = int(info.get("gpus", facts.get("gpu_count") or 1) or 1)
    # a given seed reproduces a run, wherever the host folder lies (the folder's name, not its
    # path, so a test's temporary directory does not change the noise); differently named or
    # seeded hosts get different noise sequences
    rng = (random.Random(f"{seed}:{info.get('seed')}:{vm}:{root.name}") if seed is not None
           else random.Random())
    mf = model_factors(root)
    f_link = link_factor(facts, base)
    ro = facts.get("gpu0_relaxed_ordering")
    out: list[Metric] = []
    for name in METRICS:
        if cfg.only and name not in cfg.only:
            continue
        m = new(name, sim=True, sku=sku, vm=vm)
        if name == "nccl_allreduce_busbw_gbps" and gpus < 2:
            m.skipped = f"needs 2 or more GPUs ({gpus} simulated)"
            out.append(m)
            continue
        v = base[name]
        if name in COMPUTE:
            v *= mf["compute"]
        if name in WORKLOAD:
            v *= mf["workload"]
        if name in ENERGY:
            v *= mf["energy"]
        if name in MEMORY:
            v *= mf["memory"]
        if name in LINK:
            v *= f_link
        if vm:
            v *= VM_FACTOR.get(name, 1.0)
        if ro is False:
            v *= NO_RELAXED_ORDERING.get(name, 1.0)
        cv = 0.03 if name.startswith("launch") else 0.015
        m.samples = [v * max(0.5, rng.gauss(1.0, cv)) for _ in range(cfg.repeats)]
        m.params.update(compute_factor=round(mf["compute"], 4), memory_factor=round(mf["memory"], 4),
                        workload_factor=round(mf["workload"], 4), link_factor=round(f_link, 4))
        out.append(m)
    return out
