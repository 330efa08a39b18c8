"""A workload added the way any is: this one file, and the one `register` line at its end.

It measures a fixed rate that a runtime setting doubles (`fast: true`), so a search over it has
one change worth keeping and nothing random about whether it is kept."""
from __future__ import annotations

from typing import Any, Mapping, Optional

from tuner.workloads.base import Untuned, summarize
from tuner.workloads.factory import register


class DoublingWorkload(Untuned):
    name = "doubling"

    def __init__(self) -> None:
        self.fast = False

    def runtime_dims(self) -> dict[str, list[Any]]:
        return {"fast": [False, True]}

    def runtime_settings(self) -> dict[str, Any]:
        return {"fast": self.fast}

    def validate_runtime(self, runtime: Mapping[str, Any]) -> Any:
        if set(runtime) - {"fast"} or not isinstance(runtime.get("fast", False), bool):
            raise ValueError(f"doubling: expected {{'fast': bool}}, got {dict(runtime)}")
        return dict(runtime)

    def configure(self, runtime: Mapping[str, Any]) -> None:
        self.fast = bool(self.validate_runtime(runtime or {}).get("fast", False))

    def measure(self, repeats: int = 5, timeout_s: Optional[float] = None) -> Any:
        rate = 2000.0 if self.fast else 1000.0
        return summarize("tokens_per_s", "tok/s",
                         {"one": [rate * (1 + 0.001 * i) for i in range(repeats)]})


register("doubling", lambda spec: DoublingWorkload(), "doubling (tests)")
