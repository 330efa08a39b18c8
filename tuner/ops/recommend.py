"""Operation "recommend": the shipped (or local) profile for this host, as `tuned-adm recommend`
names one, with its evidence: measured on this host (a search run in this state dir), measured
elsewhere (where and when), only simulated, or not measured end to end (vendor guidance).

The recommendation is the most specific matching profile that keeps throughput (the longest
include chain); profiles for another objective (energy, power-capped) that also match are the
alternatives, each with its own evidence."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from tuner.errors import OperationFailed
from tuner.ops.registry import operation


def evidence(prov: dict[str, Any], runs: set[str]) -> dict[str, str]:
    """{"kind": here | measured | simulated | not-measured, "text": one line for a person}."""
    source, where = str(prov.get("source") or ""), str(prov.get("measured_on") or "")
    values_from = prov.get("values_from")  # measured | simulated | guidance, where stated
    date = str(prov.get("date") or "")
    run = prov.get("run_id")
    if run and run in runs:
        return {"kind": "here", "text": f"measured on this host ({where or 'here'}: search run "
                                        f"{run}, {date})"}
    if values_from == "simulated" or "sim" in source.lower() or "simulated" in where.lower():
        return {"kind": "simulated",
                "text": f"only simulated ({where or 'a simulated host'}, {date}); not measured on "
                        "real hardware: search this host before a fleet"}
    if values_from == "measured" or (values_from is None and ("measured" in source.lower() or run)):
        return {"kind": "measured", "text": f"measured on {where or 'another host'} ({date})"}
    return {"kind": "not-measured",
            "text": f"not measured end to end: {source or 'no provenance'}"
                    + (f" ({where}, {date})" if where else "")}


@operation("recommend", reads=True)
def recommend(settings: Any) -> dict[str, Any]:
    from tuner import profiles
    from tuner.ops.profile import _dirs, profile_list

    listed = profile_list(settings)
    host = listed["host"]
    if host is None:
        raise OperationFailed("recommend: could not read this host's hardware (see `metaltune host`)")
    runs = _run_ids(Path(settings.state_dir))
    fits = []
    for it in listed["profiles"]:
        if "error" in it or it.get("abstract") or not it.get("matches_host"):
            continue
        prof = profiles.load(it["path"], _dirs(settings))
        prov = prof.provenance.model_dump(exclude_none=True)
        fits.append({"name": it["name"], "description": it["description"], "path": str(it["path"]),
                     "objective": prov.get("objective") or "throughput",
                     "specificity": len(prof.chain), "knobs": it["knobs"],
                     "evidence": evidence(prov, runs), "provenance": prov})
    if not fits:
        gpus = ", ".join(host["gpus"]) or "no GPU found"
        raise OperationFailed(f"recommend: no profile matches this host ({gpus}, driver "
                              f"{host['driver']}): `metaltune search host` finds its own settings")
    fits.sort(key=lambda f: (f["objective"] != "throughput", -f["specificity"], f["name"]))
    best, others = fits[0], fits[1:]
    return {"host": host, "recommended": best, "alternatives": others,
            "next": f"metaltune apply {best['name']} --dry-run"}


def _run_ids(state_dir: Path) -> set[str]:
    from tuner.search.store import TrialStore

    path = state_dir / "trials.db"
    if not path.exists():
        return set()
    with TrialStore(path, readonly=True) as store:
        return {r["id"] for r in store.runs()}
