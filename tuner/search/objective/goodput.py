"""`--objective goodput`: most requests/s meeting the latency SLOs (a serving workload's
goodput, `Measurement.per_size_goodput`), per size. The keep rule runs on the goodput view of
each side exactly as energy runs on the tokens/J view: the same separation test against the
noise (the goodput repeats, where the workload keeps them in
extra["per_size_goodput_samples"]) and the same per-size vetoes. No throughput floor: goodput
already counts only requests that met their SLOs."""
from __future__ import annotations

from typing import Any, Optional

from tuner.search.objective.projected import Projected
from tuner.search.objective.views import GOODPUT, project_goodput
from tuner.trial import Measurement


class Goodput(Projected):
    name = "goodput"
    help = ("most requests/s meeting the latency SLOs, per size (a serving workload that "
            "reports goodput)")
    metric = GOODPUT
    unmeasured = "goodput_unmeasured"
    needs = "goodput"
    unit_name = "goodput"

    def project(self, m: Measurement) -> Measurement:
        return project_goodput(m)

    def kernel_ok(self, device: str) -> Optional[str]:
        return f"--objective {self.name}: a kernel search times calls, it serves no requests"

    def kernel_cost(self, res: dict[str, Any]) -> Optional[float]:
        return None
