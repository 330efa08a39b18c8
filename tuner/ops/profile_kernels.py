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

from kernelsearch.harness import guard
from kernelsearch.table import source_digest
from tuner.errors import BadInput, OperationFailed

from tuner.knobs.kernels import NAME as KNOB
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
                how, source = "bundled", b["source"]
            elif store.has(sha):
                source = store.source(sha)
                how = "in the local store"
            else:
                raise StoreError(f"neither bundled in kernel_sources nor in {store.root}")
        except StoreError as e:
            raise BadInput(f"{prof.path}: field kernel_sources.{sha[:12]}: {e}") from None
        bad = guard.check_source(source)
        if bad:  # what this host's judge would refuse is never installed, whatever it claims
            raise OperationFailed(f"{prof.path}: kernel_sources.{sha[:12]}: refused by the "
                                  f"static guard: {bad[0]}")
        sources.append({"sha256": sha, "from": how, "verified": True})
    return {"table": table, "entries": len(table.entries), "sources": sources}


def judge(prof: Any, state_dir: Path, plan: dict[str, Any]) -> None:
    """This host's judgement of every source the table names that this host has not judged
    itself (a bundled record's verdict is another host's claim: provenance only), in the
    judge's sandboxed child; nothing here imports candidate code. A rejection fails the apply
    (exit 1) before anything is written; an acceptance goes with the plan to `install`."""
    from kernelsearch import dispatch
    from kernelsearch.store import Record, StoreError, environment

    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    env = environment(device)
    store = _store(state_dir)
    table = plan["table"]
    for s in plan["sources"]:
        sha = s["sha256"]
        fams = {e.family for e in table.entries if source_digest(e.variant) == sha}
        if s["from"] == "bundled":
            b = prof.kernel_sources[sha]
            source = b["source"]
            try:
                rec = Record.from_dict(b.get("record"), f"{prof.path}: field kernel_sources."
                                                        f"{sha[:12]}.record")
            except StoreError as e:
                raise BadInput(str(e)) from None
            local = store.record(sha) if store.has(sha) else None
        else:
            source, local = store.source(sha), store.record(sha)
            rec = local
        if local is not None and local.quarantined:
            raise OperationFailed(f"{prof.path}: kernel_sources.{sha[:12]}: quarantined on this "
                                  f"host ({local.quarantined.get('why', '')[:200]})")
        if fams != {rec.family}:
            raise OperationFailed(f"{prof.path}: kernel_sources.{sha[:12]}: the table uses it "
                                  f"for {sorted(fams)}; its record says {rec.family}")
        s["family"] = rec.family
        if local is not None and local.judged_on(env):
            s["judged_here"] = "before"
            continue
        v = dispatch.judge_here(table, sha, rec.family, source, device)
        if not v.accepted:
            raise OperationFailed(f"{prof.path}: kernel_sources.{sha[:12]}: judged on this host "
                                  f"({env['gpu']}) and rejected: {v.code}/{v.rule}: "
                                  f"{v.detail[:300]}")
        s["judged_here"] = "now"
        s["_judgement"] = (v.to_dict(), env)


def change(prof: Any, plan: dict[str, Any], knobs: dict[str, Any]) -> Optional[dict[str, Any]]:
    """The `kernels.table` value the profile asks for (its table, stamped with the profile's
    name), or None when that table is in force already."""
    table = plan["table"]
    table.meta = dict(table.meta, profile=prof.name)
    want = table.to_dict()
    k = knobs.get(KNOB)
    if k is None:
        raise OperationFailed(f"{KNOB}: no kernel table knob on this host")
    return None if k.readback_matches(want, k.read()) else want


def install(prof: Any, state_dir: Path, plan: dict[str, Any]) -> dict[str, Any]:
    """Import the bundled sources (each verified again as it is written, with this host's own
    judgement); the table itself is written by the transaction (`kernels.table`)."""
    from kernelsearch.store import StoreError

    store = _store(state_dir)
    for s in plan["sources"]:
        judgement = s.pop("_judgement", None)
        try:
            if s["from"] == "bundled":
                store.import_bundle(s["sha256"], prof.kernel_sources[s["sha256"]],
                                    where=f"{prof.path}: field kernel_sources",
                                    judgement=judgement)
            elif judgement is not None:
                store.add_judgement(s["sha256"], *judgement)
        except StoreError as e:
            raise BadInput(str(e)) from None
    out = Path(state_dir) / "kernels" / ACTIVE
    return {"table": str(out), "store": str(store.root), "entries": plan["entries"],
            "sources": plan["sources"]}
