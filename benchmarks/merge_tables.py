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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernelsearch import table  # noqa: E402
from kernelsearch.table import DispatchTable, overlaps, trim  # noqa: E402,F401  (re-exported)


def wanted(e, only: list[str]) -> bool:
    if not only:
        return True
    for o in only:
        fam, _, var = o.partition(":")
        if e.family == fam and (not var or e.variant == var):
            return True
    return False


def merge(base: DispatchTable, news: list[DispatchTable], only: list[str], note: str) -> DispatchTable:
    return table.merge(base, [e for t in news for e in t.entries if wanted(e, only)], note)


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
