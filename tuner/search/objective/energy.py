"""`--objective energy`: most tokens per joule, held to a throughput floor.

The keep rule runs on the tokens/J view of each side (tuner.search.objective.projected). A
winner is then also held to a floor: at every size its median tokens/s must be at least
`throughput_floor` (default 0.95) of the run's start, else `below_throughput_floor`. Why: with
tokens/J alone the best setting is often a very low clock that halves throughput (Zeus, NSDI'23:
the energy-optimal GPU power limit of a training job is far below the time-optimal one); the
datacentre wants energy saved at "a few percent" of throughput (Perseus, SOSP'24), not at any
cost. Zeus's MaxSlowdownConstraint is the model."""
from __future__ import annotations

from typing import Any, Optional, Sequence

from pydantic import Field

from tuner.search import keep
from tuner.search.objective.projected import Projected
from tuner.search.objective.views import TOK_PER_J, project_energy
from tuner.trial import Measurement

DEFAULT_FLOOR = 0.95


def throughput_ratios(a: Sequence[Measurement], b: Sequence[Measurement]) -> dict[str, float]:
    """Per size (else the headline), the candidate's median tokens/s over the incumbent's."""
    pa, pb = keep.pool(list(a)), keep.pool(list(b))
    assert pa is not None and pb is not None
    if pa.per_size and pb.per_size:
        return {k: pb.per_size[k] / v for k, v in pa.per_size.items() if k in pb.per_size and v > 0}
    return {keep.HEADLINE: pb.value / pa.value if pa.value > 0 else 0.0}


def floor_stats(floor: float, ratios: dict[str, float],
                anchor: Optional[dict[str, float]]) -> dict[str, Any]:
    """The sizes whose throughput, against the run's start, is under `floor` (worst first)."""
    vs_start = {k: r * (anchor or {}).get(k, 1.0) for k, r in ratios.items()}
    below = sorted((k for k, r in vs_start.items() if r < floor), key=vs_start.__getitem__)
    return {"throughput_ratio": ratios, "vs_start": vs_start, "throughput_floor": floor,
            "below_floor": below}


class Energy(Projected):
    name = "energy"
    help = ("most tokens per joule, keeping tokens/s at every size >= --throughput-floor "
            "(default 0.95) of the start")
    metric = TOK_PER_J
    unmeasured = "energy_unmeasured"
    needs = "energy"
    unit_name = "tokens/J"
    flags = {"throughput_floor": "--throughput-floor"}

    throughput_floor: float = Field(DEFAULT_FLOOR, gt=0, le=1)

    def project(self, m: Measurement) -> Measurement:
        return project_energy(m)

    def after(self, verdict: str, reason: str, stats: dict[str, Any],
              incumbent: Sequence[Measurement], candidate: Sequence[Measurement],
              anchor: Optional[dict[str, float]]) -> tuple[str, str, dict[str, Any]]:
        fl = floor_stats(self.throughput_floor, throughput_ratios(incumbent, candidate), anchor)
        stats = {**stats, "objective": self.name, **fl}
        if verdict == "kept" and fl["below_floor"]:
            return "reverted", "below_throughput_floor", stats
        return verdict, reason, stats

    def score(self, candidate: Sequence[Measurement], reason: str,
              stats: dict[str, Any]) -> Optional[float]:
        """Tokens/J, penalised by how far below the floor its throughput fell."""
        tj = super().score(candidate, reason, stats)
        if tj is None:
            return None
        worst = min((stats.get("vs_start") or {1: 1.0}).values())
        return tj * min(1.0, worst / self.throughput_floor) ** 4

    def own_reason(self, reason: str) -> bool:
        return reason in (self.unmeasured, "below_throughput_floor")

    def explain(self, reason: str, stats: dict[str, Any]) -> str:
        if reason == "below_throughput_floor":
            k = stats["below_floor"][0]
            return (f"tokens/J {stats['gain']:+.2%} but {k} at {stats['vs_start'][k]:.1%} "
                    f"of the start's tokens/s (floor {stats['throughput_floor']:.0%})")
        return super().explain(reason, stats)

    kernel_metric = ("energy a call", "uJ", 1e6)

    def kernel_cost(self, res: dict[str, Any]) -> Optional[float]:
        """Joules a call (the judge's NVML reading over the timed calls)."""
        return res.get("energy_j") or None

    def kernel_band(self, res: dict[str, Any]) -> Optional[Any]:
        return None

    def kernel_refusal(self, res: dict[str, Any]) -> Optional[str]:
        return None if res.get("energy_j") else self.unmeasured

    def kernel_ok(self, device: str) -> Optional[str]:
        return None if device == "cuda" else \
            f"--objective {self.name}: a kernel search on {device} measures no energy (NVML is on a GPU)"
