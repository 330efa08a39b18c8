"""The simulated host's workload: runs the performance model on the current device state.

`SimWorkload(root).measure(repeats, timeout_s)` returns a `tuner.trial.Measurement` (throughput
summed over the host's GPUs, ~2% noise per repeat from a seeded RNG keyed by a counter in the state,
so the same seed and call sequence give the same numbers) and its energy from the model (tokens/J and
mean board watts under the key "all", energy_source "sim_model"; tuner/sim/power.py). Each run publishes the GPU's sensors
(clock, power, temperature, clock event reasons); a run that hangs is also seen busy (utilisation
100 %, its pid as a compute process) for as long as it blocks. Unstable settings queue Xid events (events.jsonl + a kmsg line) and may hang; a hang, from
the model or from `sim inject DIR hang`, blocks for real until timeout_s and raises WorkloadHang.
"""
from __future__ import annotations

import os
import random
import statistics
import time
from pathlib import Path
from typing import Any

from tuner.sim import model, power
from tuner.sim.events import queue_xid
from tuner.sim.skus import get_sku
from tuner.sim.state import SimState
from tuner.trial import Measurement
from tuner.workloads.base import Untuned

NOISE_SIGMA = model.NOISE_SIGMA
ALL = "all"  # the energy key of a workload without sizes


from tuner.errors import WorkloadHang  # noqa: E402  (one class for every workload's hang)


class SimWorkload(Untuned):
    """Tunable with nothing but the host (Untuned): the model has no runtime and no kernels."""

    name = "sim"
    metric = "throughput"

    def __init__(self, root: str | os.PathLike[str]):
        self.root = Path(root)
        self.state = SimState(root)

    def _start(self, kind: str) -> tuple[list[model.Outcome], bool, list[int], random.Random, str]:
        """One locked step: evaluate every GPU, publish its sensors, roll Xids and hangs."""
        pid = os.getpid()
        with self.state.edit() as st:
            sku = get_sku(st["sku"])
            st["counter"] = counter = int(st.get("counter", 0)) + 1
            rng = random.Random(f"metaltune-sim:{st.get('seed', 0)}:{counter}")
            outs, xids, hang = [], [], False
            for g in st["gpus"]:
                power.fold(g, sku, busy=bool(g.get("busy")))  # the counter up to now
                o = model.evaluate(sku, g)
                outs.append(o)
                g["last_run"] = {"clock_mhz": o.clock_mhz, "mem_clock_mhz": o.mem_clock_mhz,
                                 "power_w": round(o.power_w, 1), "temp_c": o.temp_c,
                                 "reasons": o.reasons, "regime": o.regime, "kind": kind,
                                 "time": time.time()}
                if o.xid_prob and rng.random() < o.xid_prob:
                    x = rng.choice(o.xid_choices)
                    queue_xid(self.state, st, g["index"], x, pid=pid)
                    xids.append(x)
                inj = g.setdefault("injected", {})
                if inj.get("hang"):
                    inj["hang"] = False  # one-shot: the next run blocks
                    hang = True
                elif o.hang_prob and rng.random() < o.hang_prob:
                    hang = True
            if hang:  # a run that completes takes microseconds here: only a hang is seen busy
                for g in st["gpus"]:
                    g["busy"] = {"pid": pid, "since": time.time()}
            return outs, hang, xids, rng, sku.unit

    def _finish(self) -> None:
        pid = os.getpid()
        with self.state.edit() as st:
            sku = get_sku(st["sku"])
            for g in st["gpus"]:
                if (g.get("busy") or {}).get("pid") == pid:
                    power.fold(g, sku, busy=True)  # the hung run's draw, up to now
                    g["busy"] = None

    def _hang(self, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        try:
            while (left := deadline - time.monotonic()) > 0:
                time.sleep(min(0.05, left))
        finally:
            self._finish()
        raise WorkloadHang(f"simulated {what} made no progress for {timeout_s:g} s")

    def measure(self, repeats: int = 5, timeout_s: float = 30.0) -> Measurement:
        if repeats < 1:
            raise ValueError("repeats must be >= 1")
        outs, hang, xids, rng, unit = self._start("workload")
        if hang:
            self._hang(timeout_s, "workload")
        true = sum(o.throughput for o in outs)
        samples = [round(true * (1.0 + rng.gauss(0.0, NOISE_SIGMA)), 2) for _ in range(repeats)]
        watts = [o.power_w for o in outs]  # utilisation 1: a busy decode (tuner.sim.power)
        extra: dict[str, Any] = {
            "xids": xids,
            "gpus": [{"clock_mhz": o.clock_mhz, "mem_clock_mhz": o.mem_clock_mhz,
                      "power_w": round(o.power_w, 1), "temp_c": o.temp_c, "reasons": o.reasons,
                      "regime": o.regime} for o in outs],
            # each board's own draw: a per-GPU power budget holds per board, not on the mean
            "per_board_watts": {f"gpu{i}": round(o.power_w, 1) for i, o in enumerate(outs)},
        }
        value = statistics.median(samples)
        # sizeless: energy under the one key "all"; tokens/J of the whole host, watts per board
        return Measurement(metric=self.metric, unit=unit, value=value, samples=samples,
                           per_size_tok_per_j={ALL: round(value / sum(watts), 4)},
                           per_size_watts={ALL: round(sum(watts) / len(watts), 1)},
                           energy_source="sim_model", extra=extra)

    def canary(self, timeout_s: float = 10.0) -> bool:
        """A short known-answer run: True when it completes. An injected hang blocks it too."""
        _, hang, _, _, _ = self._start("canary")
        if hang:
            self._hang(timeout_s, "canary")
        return True
