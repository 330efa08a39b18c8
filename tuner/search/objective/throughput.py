"""`--objective throughput` (the default, the rule as it always was): most tokens/s."""
from __future__ import annotations

from tuner.search.objective.base import Objective


class Throughput(Objective):
    name = "throughput"
    help = "most tokens/s (the default)"
