"""Operation "trials": the trial store, newest last."""
from __future__ import annotations

from typing import Any, Optional

from tuner.ops.args import Count
from tuner.ops.registry import operation


@operation("trials", reads=True)
def trials(settings: Any, limit: Optional[Count] = 50, run_id: Optional[str] = None,
           verdict: Optional[str] = None) -> dict[str, Any]:
    from tuner.search.store import TrialStore

    path = settings.state_dir / "trials.db"
    if not path.exists():
        return {"store": str(path), "trials": [], "runs": []}
    with TrialStore(path, readonly=True) as store:
        ts = store.list(run_id=run_id, limit=limit, verdict=verdict)
        return {"store": str(path), "runs": store.runs(),
                "trials": [t.model_dump(mode="json") for t in ts]}


@operation("trial_stats", reads=True)
def trial_stats(settings: Any, run_id: Optional[str] = None) -> dict[str, Any]:
    """Per proposer: outcome shares, spend per kept change, gain over time (tuner.search.trial_stats).
    Read-only: the caller draws the chart (`trial_stats.chart`), never the daemon."""
    from tuner.search import trial_stats as ts
    from tuner.errors import BadInput
    from tuner.search.store import TrialStore

    path = settings.state_dir / "trials.db"
    if not path.exists():
        raise BadInput(f"{path}: no trial store yet (run a search first)")
    with TrialStore(path) as store:
        runs = store.runs()
        if run_id and run_id not in {r["id"] for r in runs}:
            raise BadInput(f"--run {run_id!r}: no such run; expected one of "
                           f"{', '.join(r['id'] for r in runs[-5:]) or 'none'}")
        trials = store.list(run_id=run_id)
    return {"store": str(path), "run_id": run_id, "trials": len(trials),
            "proposers": ts.stats(trials, runs)}
