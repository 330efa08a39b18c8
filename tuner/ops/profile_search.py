"""`metaltune profile export --from-search RUN`: a profile of only what a search changed (its
kept settings that differ from the run's start), with the objective, the policy and the
measurements (start and kept tokens/s and tokens/J) in provenance. Not the host's every knob:
BIOS attributes and untuned sysctls are not the search's result and stay out."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Optional

from tuner.errors import BadInput, OperationFailed


def find_run(runs: list[dict[str, Any]], run: str) -> dict[str, Any]:
    """A run by its id or the end of it (as `trials` prints it)."""
    hits = [r for r in runs if r["id"] == run] or [r for r in runs if r["id"].endswith(run)]
    if len(hits) != 1:
        known = ", ".join(r["id"] for r in runs[-5:]) or "none"
        what = "names several runs" if hits else "no such run"
        raise BadInput(f"--from-search {run!r}: {what}; expected one of {known} "
                       "(`metaltune trials` lists them)")
    return hits[0]


def _measured(m: Optional[dict[str, Any]]) -> dict[str, Any]:
    from tuner.workloads.stats import geomean

    if not m:
        return {}
    out: dict[str, Any] = {}
    if m.get("unit") == "tok/s":
        out["tok_per_s"] = round(float(m["value"]), 2)
    tpj = list((m.get("per_size_tok_per_j") or {}).values())
    if tpj:
        out["tok_per_j"] = round(float(geomean(tpj)), 4)
    watts = list((m.get("per_size_watts") or {}).values())
    if watts:
        out["watts"] = round(float(max(watts)), 1)
    return out


def _candidate_measurement(trial: Any) -> Optional[dict[str, Any]]:
    ms = trial.measurements or {}
    raw = ms.get("candidate") or (ms.get("holistic") or {}).get("candidate")
    if isinstance(raw, list):
        raw = raw[0] if raw else None
    return raw if isinstance(raw, dict) else None


def profile_doc(state_dir: Path, run: str, name: Optional[str], gpus: list[str],
                backend: str) -> dict[str, Any]:
    """The profile document (before kernel sources are bundled)."""
    from tuner.search.store import TrialStore
    from tuner.knobs.base import values_equal

    path = state_dir / "trials.db"
    if not path.exists():
        raise BadInput(f"--from-search: {path}: no trial store yet (run a search first)")
    with TrialStore(path, readonly=True) as store:
        meta_run = find_run(store.runs(), run)
        trials = store.list(run_id=meta_run["id"])
    meta = meta_run["meta"] or {}
    start = meta.get("start") or {}
    kept = [t for t in trials if t.verdict == "kept"]
    if not kept:
        raise OperationFailed(f"run {meta_run['id']} kept nothing ({len(trials)} trials): "
                              "there is no result to export")
    settings: dict[str, Any] = dict(start)
    for t in kept:
        settings.update(t.candidate.knobs or {})
    changed = {k: v for k, v in sorted(settings.items()) if not values_equal(v, start.get(k))}
    table = state_dir / "kernels" / f"mixed-{meta_run['id']}.json"
    if not changed and not table.exists():
        raise OperationFailed(f"run {meta_run['id']} kept no host setting different from its "
                              "start: there is nothing for a profile to change")
    gain = 1.0
    for t in kept:
        gain *= 1.0 + (t.gain or 0.0)
    objective = meta.get("objective") or "throughput"
    start_m, kept_m = _measured(meta.get("baseline")), _measured(_candidate_measurement(kept[-1]))
    prov: dict[str, Any] = {
        "source": f"metaltune {meta_run['kind'].replace('-', ' ')}",
        "run_id": meta_run["id"],
        "measured_on": ", ".join(gpus) + (" (simulated)" if backend == "sim" else "") or None,
        "values_from": "simulated" if backend == "sim" else "measured",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(meta_run["started_at"])),
        "workload": meta.get("workload"),
        "objective": objective,
        "gain_pct": round((gain - 1.0) * 100, 2),
        "trials": len(trials),
        "kept_trials": [t.number for t in kept],
        "policy": meta.get("policy"),
        "proposer": meta.get("proposer"),
        "measurements": {"start": start_m, "kept": kept_m},
    }
    for k in ("throughput_floor", "power_budget_w"):
        if meta.get(k) is not None:
            prov[k] = meta[k]
    if start_m.get("tok_per_j") and kept_m.get("tok_per_j"):
        prov["tok_per_j_gain_pct"] = round((kept_m["tok_per_j"] / start_m["tok_per_j"] - 1) * 100, 2)
    doc: dict[str, Any] = {
        "name": name or f"search-{meta_run['id'][-6:]}",
        "description": f"what {prov['source']} run {meta_run['id']} kept ({objective})",
        "knobs": changed,
    }
    if gpus:
        doc["match"] = {"gpu_name": sorted(set(gpus))}
    if table.exists():
        from kernelsearch.table import DispatchTable

        doc["kernels"] = DispatchTable.load(str(table)).to_dict()
    doc["provenance"] = {k: v for k, v in prov.items() if v is not None}
    return doc
