"""Operation "trials": the trial store, newest last."""
from __future__ import annotations

from typing import Any, Optional

from tuner.ops.registry import operation


@operation("trials")
def trials(settings: Any, limit: Optional[int] = 50, run_id: Optional[str] = None,
           verdict: Optional[str] = None) -> dict[str, Any]:
    from tuner.search.store import TrialStore

    path = settings.state_dir / "trials.db"
    if not path.exists():
        return {"store": str(path), "trials": [], "runs": []}
    with TrialStore(path, readonly=True) as store:
        ts = store.list(run_id=run_id, limit=limit, verdict=verdict)
        return {"store": str(path), "runs": store.runs(),
                "trials": [t.model_dump(mode="json") for t in ts]}
