"""benchmarks/merge_tables.py: new entries replace what they overlap, base ranges sticking out
are kept, and lookups then find the new kernel inside its range and the old one outside."""
import importlib.util
from pathlib import Path

from kernelsearch.table import DispatchTable, Entry

SPEC = importlib.util.spec_from_file_location(
    "merge_tables", Path(__file__).resolve().parents[2] / "benchmarks" / "merge_tables.py")
mt = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(mt)


def entry(lo, hi, variant, cols=8192, **cfg):
    return Entry(family="rmsnorm", dtype="bfloat16", match={"cols": cols},
                 ranges={"rows": [lo, hi]}, variant=variant,
                 config=cfg or {"ROWS": 1, "num_warps": 16})


def test_overlapped_base_ranges_are_trimmed_not_lost():
    base = DispatchTable([entry(8, 362, "looped", BLOCK=4096, STAGES=2, num_warps=16),
                          entry(363, 32768, "row"), entry(32769, 65536, "row"),
                          entry(1, 100, "row", cols=4096)])
    new = DispatchTable([entry(16384, 65536, "streamed", BLOCK=4096, STAGES=1, num_warps=16)])
    out = mt.merge(base, [new], [], "")
    got = {(e.match["cols"], tuple(e.ranges["rows"]), e.variant) for e in out.entries}
    assert got == {(8192, (16384, 65536), "streamed"), (8192, (8, 362), "looped"),
                   (8192, (363, 16383), "row"), (4096, (1, 100), "row")}
    for rows, variant in ((100, "looped"), (1000, "row"), (16383, "row"), (16384, "streamed"),
                          (65536, "streamed")):
        assert out.lookup("rmsnorm", "bfloat16", {"rows": rows, "cols": 8192}).variant == variant
    assert out.lookup("rmsnorm", "bfloat16", {"rows": 70000, "cols": 8192}) is None


def test_only_filters_families_and_variants():
    base = DispatchTable([entry(1, 10, "row")])
    new = DispatchTable([entry(1, 10, "streamed", BLOCK=1024, STAGES=1, num_warps=4),
                         entry(1, 10, "looped", cols=4096, BLOCK=1024, STAGES=1, num_warps=4)])
    out = mt.merge(base, [new], ["rmsnorm:looped"], "")
    assert [(e.match["cols"], e.variant) for e in out.entries] == [(4096, "looped"), (8192, "row")]
