"""A host profile's kernels: its `kernels:` dispatch table and the stored sources it names.

`profile export` bundles every `src:<sha256>` source the table names (`kernel_sources:`, each
with its store record, so the importing host knows where it was judged); `apply` checks the
table, verifies every bundled source against its digest (a mismatch is bad input: nothing is
written), imports them into this host's store and installs the table as
STATE_DIR/kernels/active.json, which `kernelsearch.dispatch.install(path, store=STATE_DIR/
kernels/sources)` loads (re-judging a source judged on another GPU, driver or triton first)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from tuner.errors import BadInput

from tuner.search.sources import ACTIVE  # noqa: F401  (where apply installs the table)


def _store(state_dir: Path) -> Any:
    from tuner.search.sources import store_in

    return store_in(state_dir)


def table_of(kernels: dict[str, Any], where: str) -> Optional[Any]:
    from kernelsearch.table import DispatchTable, TableError

    if not kernels:
        return None
    try:
        return DispatchTable.from_dict(kernels, where=f"{where}: field kernels")
    except TableError as e:
        raise BadInput(str(e)) from None


def bundle(doc: dict[str, Any], state_dir: Path) -> dict[str, Any]:
    """Add `kernel_sources` for every source `doc['kernels']` names (from this host's store,
    unless the profile already carries it)."""
    from kernelsearch.store import StoreError

    table = table_of(doc.get("kernels") or {}, doc.get("name") or "profile")
    if table is None or not table.sources():
        return doc
    have = dict(doc.get("kernel_sources") or {})
    store = _store(state_dir)
    for sha in table.sources():
        if sha in have:
            continue
        try:
            have[sha] = store.export(sha)
        except StoreError as e:
            raise BadInput(f"kernels names src:{sha}: not exportable from {store.root}: {e}") from None
    doc["kernel_sources"] = {sha: have[sha] for sha in table.sources()}
    return doc


def check(prof: Any, state_dir: Path) -> Optional[dict[str, Any]]:
    """Everything about the profile's kernels that can fail, before anything is written: the
    table's shape, and each named source's digest (bundled, or already in this host's store)."""
    from kernelsearch.store import StoreError, digest

    table = table_of(prof.kernels, prof.path)
    if table is None:
        return None
    store = _store(state_dir)
    sources = []
    for sha in table.sources():
        b = prof.kernel_sources.get(sha)
        try:
            if b is not None:
                if not isinstance(b, dict) or not isinstance(b.get("source"), str):
                    raise StoreError("expected {source: TEXT, record: {...}}")
                if digest(b["source"]) != sha:
                    raise StoreError("digest mismatch: the bundled source does not hash to its name")
                how = "bundled"
            elif store.has(sha):
                store.source(sha)
                how = "in the local store"
            else:
                raise StoreError(f"neither bundled in kernel_sources nor in {store.root}")
        except StoreError as e:
            raise BadInput(f"{prof.path}: field kernel_sources.{sha[:12]}: {e}") from None
        sources.append({"sha256": sha, "from": how, "verified": True})
    return {"table": table, "entries": len(table.entries), "sources": sources}


def install(prof: Any, state_dir: Path, plan: dict[str, Any]) -> dict[str, Any]:
    """Import the bundled sources (each verified again as it is written) and install the table."""
    from kernelsearch.store import StoreError

    store = _store(state_dir)
    for s in plan["sources"]:
        if s["from"] == "bundled":
            try:
                store.import_bundle(s["sha256"], prof.kernel_sources[s["sha256"]],
                                    where=f"{prof.path}: field kernel_sources")
            except StoreError as e:
                raise BadInput(str(e)) from None
    out = Path(state_dir) / "kernels" / ACTIVE
    table = plan["table"]
    table.meta = dict(table.meta, profile=prof.name)
    table.save(out)
    return {"table": str(out), "store": str(store.root), "entries": plan["entries"],
            "sources": plan["sources"]}
