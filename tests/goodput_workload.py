"""A serving-like workload on the simulated host for the goodput objective's tests: the sim
workload's tokens/s, plus goodput (requests/s meeting the latency SLOs) under the one size
"all", with a repeat per sample in extra["per_size_goodput_samples"] as the field contract of
tuner.trial.Measurement says: each repeat's tokens/s over TOKENS tokens a request (every request
meets its SLOs here; the serving workload is what measures real ones)."""
from __future__ import annotations

from typing import Optional

from tuner.sim.workload import ALL, SimWorkload
from tuner.trial import Measurement

TOKENS = 256
NAME = "sim-goodput"


class SimGoodput(SimWorkload):
    name = NAME

    def measure(self, repeats: int = 5, timeout_s: Optional[float] = 30.0) -> Measurement:
        m = super().measure(repeats=repeats, timeout_s=timeout_s or 30.0)
        reqs = [s / TOKENS for s in m.samples]
        m.per_size_goodput = {ALL: sorted(reqs)[len(reqs) // 2]}
        m.extra["per_size_goodput_samples"] = {ALL: reqs}
        return m


def register() -> None:
    from tuner.workloads.factory import register as reg

    reg(NAME, lambda spec: SimGoodput(spec.host.root), backend="sim")
