"""Merge dispatch tables: entries of each NEW table replace the BASE entries they overlap (same
family, dtype and match, intersecting ranges; a base range sticking out on one side or both is
kept there); the rest of BASE is kept. Lookups take the first
covering entry, so new entries go first. Optionally keep only some families or variants of NEW
(e.g. swiglu/rows where the model passes strided halves that other variants would copy).

    python3 benchmarks/merge_tables.py BASE NEW [NEW...] --out OUT [--only rope,rmsnorm:streamed]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernelsearch.table import DispatchTable  # noqa: E402


def overlaps(a, b) -> bool:
    if (a.family, a.dtype, a.match) != (b.family, b.dtype, b.match):
        return False
    for k in set(a.ranges) & set(b.ranges):
        (alo, ahi), (blo, bhi) = a.ranges[k], b.ranges[k]
        if ahi < blo or bhi < alo:
            return False
    return True


def wanted(e, only: list[str]) -> bool:
    if not only:
        return True
    for o in only:
        fam, _, var = o.partition(":")
        if e.family == fam and (not var or e.variant == var):
            return True
    return False


def trim(e, n) -> list:
    """What is left of base entry `e` outside new entry `n`: where the two differ in one range
    dim only, the parts of e's range below and above n's (a base entry validated on rows
    363-65536 keeps 363-16383 when a new one takes 16384-65536); otherwise nothing."""
    import dataclasses

    diff = [k for k in e.ranges if e.ranges[k] != n.ranges.get(k)]
    if len(diff) != 1 or set(e.ranges) != set(n.ranges):
        return []
    k = diff[0]
    (lo, hi), (nlo, nhi) = e.ranges[k], n.ranges[k]
    parts = [(lo, nlo - 1)] if lo < nlo else []
    parts += [(nhi + 1, hi)] if hi > nhi else []
    return [dataclasses.replace(e, ranges={**e.ranges, k: [a, b]}) for a, b in parts]


def merge(base: DispatchTable, news: list[DispatchTable], only: list[str], note: str) -> DispatchTable:
    added = [e for t in news for e in t.entries if wanted(e, only)]
    kept = list(base.entries)
    for n in added:
        kept = [part for e in kept for part in ((trim(e, n) if overlaps(e, n) else [e]))]
    meta = dict(base.meta)
    meta[f"update_{time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())}"] = note or (
        f"merged {len(added)} entries ({', '.join(sorted({e.family for e in added}))}); "
        f"{len(base.entries) - len(kept)} overlapping entries replaced")
    return DispatchTable(added + kept, device=base.device, meta=meta)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("base")
    ap.add_argument("new", nargs="+")
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="", help="family or family:variant list to take from NEW")
    ap.add_argument("--note", default="")
    a = ap.parse_args()
    t = merge(DispatchTable.load(a.base), [DispatchTable.load(p) for p in a.new],
              [o for o in a.only.split(",") if o], a.note)
    t.save(a.out)
    for e in t.entries:
        print(e.family, e.match, e.ranges, e.variant, e.config)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
