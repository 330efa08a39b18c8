"""The energy of a model-process measurement, read by the parent (issue 42, item 2).

The model process runs candidate code, so the watts and tokens/J in its reply can say anything:
a candidate's process claiming 100 W was kept under a 600 W budget while its board drew 700 W.
So the search's process reads NVML's energy counter itself (kernelsearch.energy.EnergyMeter,
read only) around the `measure` request, the same window its clock checks the reply's tokens/s
against (tuner.workloads.model_trust), and that reading replaces whatever the process reported:
per size, the window's mean board watts, and tokens/J = the size's tokens/s / those watts. One
window covers every size of the request (the parent cannot see where one size ends), so a
size's watts are the request's mean. Where the parent reads nothing (no GPU, no NVML) the
measurement has no energy, never the child's; the child's claim is kept beside it in
extra["energy"]["reported"] for the record. On the simulated host the sim host's power model
is the parent's reading (tuner.sim.llama_host, in the search's process)."""
from __future__ import annotations

from typing import Any, Optional

from kernelsearch.energy import possible_w


def meter_for(device: str) -> Any:
    """A kept-open EnergyMeter for the model process's CUDA device ("cuda", "cuda:N"), None
    elsewhere (tests replace this). NVML counts boards by their physical index: the model
    process's device index is taken as one (CUDA_VISIBLE_DEVICES is not remapped here)."""
    if not str(device).startswith("cuda"):
        return None
    from kernelsearch.energy import EnergyMeter

    _, _, idx = str(device).partition(":")
    return EnergyMeter(int(idx) if idx.isdigit() else 0, keep_open=True)


def replace(m: Any, reading: Optional[Any]) -> Any:
    """`m` (a Measurement from the model process) with its energy fields the parent's
    `reading` (a kernelsearch.energy.Reading, or None: not measured)."""
    reported = {"per_size_watts": dict(m.per_size_watts), "energy_source": m.energy_source}
    w = getattr(reading, "mean_w", None)
    ok = w is not None and possible_w(w) and w > 0
    m.per_size_watts = {k: w for k in m.per_size} if ok else {}
    m.per_size_tok_per_j = {k: v / w for k, v in m.per_size.items()} if ok else {}
    m.energy_source = reading.source if ok else ""
    info = dict(m.extra.get("energy") or {})
    info["reported"] = reported  # what the process said, not believed
    info["parent"] = reading.to_dict() if reading is not None else {"reason": "no meter here"}
    m.extra["energy"] = info
    m.extra.pop("per_board_watts", None)  # the process's claim too: one board, the parent's
    return m
