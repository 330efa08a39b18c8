"""SIMULATION ONLY: the tiny Llama run for real on this CPU, scaled by a simulated GPU host.

`metaltune search mixed --workload sim-llama` needs host knobs and kernels to both show in one
CI run without a GPU. The simulated host's knobs cannot change how fast the CPU runs the Llama,
and the Llama cannot see the simulated GPU. So each measurement is:

    per-size tokens/s (the holistic Llama workload on the CPU: real kernels, runtime, dispatch)
      x  the sim host's modelled throughput for that repeat / its driver-default throughput

The second factor is `SimWorkload.measure` (tuner.sim.model with its ~2 % noise, its Xid events
and hangs for unstable settings), so a host change moves every size alike, exactly as much as
the sim model says, and instability behaves as in `--workload sim`. Nothing here claims that a
real host's settings change CPU speed: real hosts use `llama` or `cmd:` unchanged. The Llama
runs with a CPU stand-in for GPU launch and graph-capture costs (`CPU_EMULATION`, see
tuner.workloads.llama), so CUDA graphs off costs here what it costs on a GPU.
"""
from __future__ import annotations

import os
import statistics
from contextlib import contextmanager
from typing import Any, Iterator, Mapping, Optional, Sequence

from tuner.sim import model
from tuner.sim.state import SimState
from tuner.sim.workload import SimWorkload
from tuner.trial import Measurement

#: per-launch and per-capture costs on the CPU (a GPU's orders of magnitude, scaled to the tiny
#: model: graphs off pays ~35 launches per decode step, graphs on pays one capture per size)
CPU_EMULATION = {"emulate_launch_us": 100.0, "emulate_capture_us": 20000.0}
#: its Llama (tuner.workloads.llama.LlamaWorkload's arguments), here or in a model process
LLAMA_KW = {"model": "tiny", "contexts": [16, 64], "decode_batches": [2], "decode_steps": 3,
            "device": "cpu", "runtime": CPU_EMULATION}


@contextmanager
def one_thread() -> Iterator[None]:
    """The tiny model's ops are far too small for intra-op threads; on a shared CPU several
    threads of busy-waiting launches make every sample erratic. Restored afterwards."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


class SimHostLlamaWorkload:
    """Tunable (tuner.workloads.base) through its Llama: the runtime settings, kernel calls and
    output check are the Llama's; the host's effect is the sim model's factor."""

    name = "sim-llama"

    def __init__(self, root: str | os.PathLike[str], llama: Any = None,
                 hang_timeout_s: float = 1.0, runtime: Optional[Mapping[str, Any]] = None):
        from tuner.workloads.llama import LlamaWorkload

        self.sim = SimWorkload(root)
        self.llama = llama if llama is not None else LlamaWorkload(
            **{**LLAMA_KW, "runtime": {**CPU_EMULATION, **dict(runtime or {})}})
        self.hang_timeout_s = hang_timeout_s  # the sim measures in ms: longer is a hang
        st = SimState(root).read()
        # the driver defaults' modelled throughput: factor 1.0
        self.reference = sum(model.baseline(st["sku"], g.get("chip")) for g in st["gpus"])

    @property
    def runtime(self) -> Any:
        return self.llama.runtime

    def configure(self, runtime: Optional[Mapping[str, Any]]) -> None:
        self.llama.configure(runtime)

    def dispatch_changed(self) -> None:
        self.llama.dispatch_changed()

    @property
    def runs_stored_sources(self) -> bool:
        """Its Llama's: True where that runs in a model process (tuner.workloads.model_process)."""
        return bool(self.llama.runs_stored_sources)

    def install_table(self, table: Any, store_dir: Any = None) -> None:
        self.llama.install_table(table, store_dir)

    def first_step_s(self, *args: Any, **kw: Any) -> float:
        with one_thread():
            return self.llama.first_step_s(*args, **kw)

    @property
    def device(self) -> str:
        return self.llama.device

    def runtime_dims(self) -> dict[str, list[Any]]:
        return self.llama.runtime_dims()

    def runtime_settings(self) -> dict[str, Any]:
        return self.llama.runtime_settings()

    def validate_runtime(self, runtime: Mapping[str, Any]) -> Any:
        return self.llama.validate_runtime(runtime)

    def kernels_usable(self) -> Optional[str]:
        return self.llama.kernels_usable()

    def kernel_calls(self) -> dict[Any, int]:
        return self.llama.kernel_calls()

    def kernel_variants(self) -> Optional[Mapping[str, Sequence[str]]]:
        return self.llama.kernel_variants()

    def check(self) -> Optional[dict[str, Any]]:
        return self.llama.check()

    def close(self) -> None:
        self.llama.close()

    def measure(self, repeats: int = 5, timeout_s: Optional[float] = None) -> Measurement:
        from tuner.workloads.base import summarize

        host = self.sim.measure(repeats=repeats, timeout_s=self.hang_timeout_s)  # may hang/Xid
        with one_thread():
            m = self.llama.measure(repeats=repeats, timeout_s=timeout_s)
        factors = [s / self.reference for s in host.samples]
        per = m.extra["per_size_samples"]
        scaled = {k: [v * f for v, f in zip(vals, factors)] for k, vals in per.items()}
        out = summarize(m.metric, m.unit, scaled, extra={
            "simulated": "llama tokens/s x sim host throughput / driver-default throughput",
            "host_factor": statistics.median(factors), "sim": host.extra,
            **{k: m.extra.get(k) for k in ("runtime", "check", "device")},
            **{k: v for k, v in m.extra.items() if k == "model_process"}})
        # the host's modelled board draw behind every size (the Llama on the CPU has none)
        w_total = sum(g["power_w"] for g in host.extra["gpus"])
        out.per_size_tok_per_j = {k: round(v / w_total, 4) for k, v in out.per_size.items()}
        out.per_size_watts = {k: round(w_total / len(host.extra["gpus"]), 1) for k in out.per_size}
        out.extra["per_board_watts"] = dict(host.extra.get("per_board_watts") or {})
        out.energy_source = "sim_model"
        return out
