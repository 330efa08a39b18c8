"""Simulated host: a folder that holds a whole machine (see docs/INTERNALS.md).

Its workloads join the workload registry here (tuner.workloads.factory): every simulated host is
opened through this package, so they are there whenever a sim host is."""
from __future__ import annotations

from typing import Any


def _sim(spec: Any) -> Any:
    from tuner.sim.workload import SimWorkload

    return SimWorkload(spec.host.root)


def _sim_llama(spec: Any) -> Any:
    from tuner.sim.llama_host import SimHostLlamaWorkload

    return SimHostLlamaWorkload(spec.host.root)


def _sim_llama_held(spec: Any) -> Any:
    """As a search holds it: the sim host's factor here, its Llama in a model process."""
    from tuner.sim.llama_host import LLAMA_KW, SimHostLlamaWorkload
    from tuner.workloads.model_process import ModelWorkload, Recipe

    return SimHostLlamaWorkload(spec.host.root, llama=ModelWorkload(
        Recipe(llama=dict(LLAMA_KW), threads=1, timeout_s=spec.timeout_s)))


def register_workloads() -> None:
    """Put `sim` and `sim-llama` in the workload registry (again: the same entries)."""
    from tuner.workloads.factory import register

    register("sim", _sim, backend="sim")
    register("sim-llama", _sim_llama, backend="sim", model_process=_sim_llama_held)


register_workloads()
