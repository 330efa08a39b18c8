"""`--objective throughput` (the default, the rule as it always was): most tokens/s."""
from __future__ import annotations

from typing import Any, Sequence

from tuner.search.objective.base import Objective
from tuner.trial import Measurement


class Throughput(Objective):
    name = "throughput"
    help = "most tokens/s (the default)"

    def summary(self, start: Sequence[Measurement], kept: Sequence[Measurement]) -> dict[str, Any]:
        out = super().summary(start, kept)
        return {**out, "unit": out["throughput"]["unit"]}  # the workload's own unit
