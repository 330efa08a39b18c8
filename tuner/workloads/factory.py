"""A workload by the name the user gives (`--workload`)."""
from __future__ import annotations

from typing import Any, Optional

from tuner.errors import BadInput


def make_workload(host: Any, workload: Optional[str], metric_regex: Optional[str],
                  timeout_s: float) -> Any:
    """`sim` (the simulated host's model), `sim-llama` (the CPU Llama scaled by the simulated
    host's model: host and kernel effects in one metric, tuner.sim.llama_host), `cmd:<command
    line>` (the user's own benchmark, with --metric-regex), or `llama` (the holistic inference
    workload)."""
    if workload is None:
        workload = "sim" if host.backend == "sim" else "llama"
    if workload in ("sim", "sim-llama"):
        if host.backend != "sim":
            raise BadInput(f"--workload {workload} needs --backend sim (it simulates the GPU host)")
        if workload == "sim-llama":
            from tuner.sim.llama_host import SimHostLlamaWorkload

            return SimHostLlamaWorkload(host.root)
        from tuner.sim.workload import SimWorkload

        return SimWorkload(host.root)
    if workload.startswith("cmd:"):
        if not metric_regex:
            raise BadInput("--workload cmd:... needs --metric-regex")
        from tuner.workloads.command import CommandWorkload

        return CommandWorkload(workload[4:], metric_regex, timeout_s=timeout_s)
    if workload == "llama":
        from tuner.workloads.llama import LlamaWorkload

        return LlamaWorkload()
    raise BadInput(f"--workload: expected sim, sim-llama, llama or cmd:<command>, got {workload!r}")
