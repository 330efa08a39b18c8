"""Dispatch table model and the runtime API model code calls."""
import json

import pytest
import torch

from kernelsearch import dispatch
from kernelsearch.families import get
from kernelsearch.table import DispatchTable, Entry, TableError, build, plan


@pytest.fixture(autouse=True)
def _clear():
    dispatch.install(None)
    yield
    dispatch.install(None)


def softmax_table(lo=1, hi=8, cols=64):
    return DispatchTable([Entry("softmax", "float32", {"cols": cols}, {"rows": [lo, hi]}, "row",
                                {"ROWS": 2, "num_warps": 1})], device="cpu")


def test_roundtrip_through_dict_and_json(tmp_path):
    t = softmax_table()
    d = t.to_dict()
    assert json.loads(json.dumps(d)) == d
    assert DispatchTable.from_dict(d).to_dict() == d
    p = tmp_path / "t.json"
    t.save(p)
    assert DispatchTable.load(p).to_dict() == d
    # a host profile's kernels: section is accepted as is
    p.write_text(json.dumps({"kernels": d}))
    assert DispatchTable.load(p).to_dict() == d


@pytest.mark.parametrize("mutate,field", [
    (lambda e: e.update(family="conv"), "family"),
    (lambda e: e.update(variant="fast"), "variant"),
    (lambda e: e.update(dtype="int8"), "dtype"),
    (lambda e: e.update(config={"ROWS": 3}), "config.ROWS"),
    (lambda e: e.update(config={"BOGUS": 1}), "config"),
    (lambda e: e.update(ranges={"rows": [9, 1]}), "ranges"),
    (lambda e: e.update(match={"cols": "64"}), "match"),
])
def test_malformed_table_names_the_field(mutate, field):
    d = softmax_table().to_dict()
    mutate(d["entries"][0])
    with pytest.raises(TableError, match=rf"entries\[0\]\.{field}"):
        DispatchTable.from_dict(d)


def test_no_table_is_plain_torch():
    k0 = dispatch.stats()["kernel"]  # counts for the whole process: other tests ran kernels
    x = torch.randn(4, 64)
    assert torch.equal(dispatch.softmax(x), torch.softmax(x, -1))
    assert dispatch.stats()["kernel"] == k0


def test_inside_range_runs_the_kernel_outside_falls_back():
    dispatch.install(softmax_table(1, 8, 64).to_dict())
    before = dispatch.stats()
    x = torch.randn(5, 64)
    y = dispatch.call("softmax", x)
    assert dispatch.stats()["kernel"] == before["kernel"] + 1
    torch.testing.assert_close(y, torch.softmax(x, -1))
    z = torch.randn(9, 64)  # rows outside [1, 8]
    assert torch.equal(dispatch.softmax(z), torch.softmax(z, -1))
    w = torch.randn(5, 65)  # other model dim
    assert torch.equal(dispatch.softmax(w), torch.softmax(w, -1))
    h = torch.randn(5, 64, dtype=torch.float16)  # other dtype
    assert torch.equal(dispatch.softmax(h), torch.softmax(h, -1))
    assert dispatch.stats()["fallback"] == before["fallback"] + 3


def test_every_family_has_a_dispatch_function_that_matches_torch():
    g = torch.Generator().manual_seed(0)
    for fam_name, fn in [("softmax", dispatch.softmax), ("rmsnorm", dispatch.rmsnorm),
                         ("swiglu", dispatch.swiglu), ("matmul", dispatch.matmul),
                         ("decode_attention", dispatch.decode_attention)]:
        fam = get(fam_name)
        args = fam.make_inputs(fam.tiny_shapes[0], "float32", "cpu", g)
        torch.testing.assert_close(fn(*args), fam.torch_default(*args))


def test_kernel_entries_for_matmul_and_decode():
    t = DispatchTable([
        Entry("matmul", "float16", {"N": 33, "K": 40}, {"M": [1, 16]}, "tiled",
              {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 8, "STAGES": 3,
               "num_warps": 4}),
        Entry("decode_attention", "float16", {"HQ": 4, "HKV": 2, "D": 16},
              {"B": [1, 4], "L": [1, 100]}, "splitkv",
              {"BLOCK_N": 16, "SPLIT": 32, "STAGES": 1, "num_warps": 2}),
    ])
    dispatch.install(t)
    g = torch.Generator().manual_seed(1)
    fam = get("matmul")
    a, b = fam.make_inputs((5, 33, 40), "float16", "cpu", g)
    k0 = dispatch.stats()["kernel"]
    torch.testing.assert_close(dispatch.matmul(a, b).double(), fam.reference(a, b),
                               atol=2e-2, rtol=2e-2)
    fam = get("decode_attention")
    q, k, v = fam.make_inputs((2, 4, 2, 37, 16), "float16", "cpu", g)
    torch.testing.assert_close(dispatch.decode_attention(q, k, v).double(),
                               fam.reference(q, k, v), atol=2e-2, rtol=2e-2)
    assert dispatch.stats()["kernel"] == k0 + 2


def test_matmul_entry_runs_only_on_the_layout_it_was_measured_on():
    """Entries are searched and timed on b = W.t() (F.linear's layout); the same shape with a
    row-major [K, N] b, a transposed a, or a strided b goes to torch (and is still right)."""
    t = DispatchTable([Entry("matmul", "float16", {"N": 24, "K": 40}, {"M": [1, 16]}, "skinny",
                             {"BLOCK_N": 16, "BLOCK_K": 256, "SPLIT_K": 1, "STAGES": 3,
                              "num_warps": 4})])
    dispatch.install(t)
    fam = get("matmul")
    g = torch.Generator().manual_seed(3)
    a, b = fam.make_inputs((4, 24, 40), "float16", "cpu", g)
    assert fam.layout_of(a, b) == fam.layout == "t"
    s0 = dispatch.stats()
    torch.testing.assert_close(dispatch.matmul(a, b).double(), fam.reference(a, b),
                               atol=2e-2, rtol=2e-2)
    assert dispatch.stats()["kernel"] == s0["kernel"] + 1
    others = {"n": (a, b.contiguous()),                       # row-major [K, N]
              "s": (a.t().contiguous().t(), b),               # a column-major
              "s2": (a, torch.randn(40, 48, dtype=torch.float16)[:, ::2])}         # b strided both ways
    for want, (x, y) in others.items():
        assert fam.layout_of(x, y) == want[0]
        s1 = dispatch.stats()
        assert torch.equal(dispatch.matmul(x, y), x @ y)
        assert dispatch.stats()["kernel"] == s1["kernel"]
        assert dispatch.stats()["fallback"] == s1["fallback"] + 1
    # a single-row a and its K-contiguous weight still dispatch (size-1 strides are arbitrary)
    s2 = dispatch.stats()
    dispatch.matmul(a[:1], b)
    assert dispatch.stats()["kernel"] == s2["kernel"] + 1


def test_build_ranges_merge_and_fallback():
    rows = [
        {"shape": [8, 4096], "dtype": "bfloat16", "variant": "row", "config": {"ROWS": 1, "num_warps": 4},
         "time_s": 5e-6, "baseline_s": 8e-6},
        {"shape": [256, 4096], "dtype": "bfloat16", "variant": "row", "config": {"ROWS": 1, "num_warps": 4},
         "time_s": 6e-6, "baseline_s": 9e-6},
        {"shape": [4096, 4096], "dtype": "bfloat16", "variant": "row", "config": {"ROWS": 2, "num_warps": 8},
         "time_s": 30e-6, "baseline_s": 30.2e-6},  # within the margin: torch keeps it
        {"shape": [8, 8192], "dtype": "bfloat16", "variant": "row", "config": {"ROWS": 1, "num_warps": 4},
         "time_s": 5e-6, "baseline_s": 8e-6},
    ]
    es = plan("softmax", rows)
    assert len(es) == 2
    e4096 = next(e for e in es if e.match == {"cols": 4096})
    # 8 and 256 share a winner and merge; the range ends at the geometric midpoint to 4096
    assert e4096.ranges == {"rows": [8, 1024]} and len(e4096.measured) == 2
    assert next(e for e in es if e.match == {"cols": 8192}).ranges == {"rows": [8, 8]}
    t = DispatchTable(es)
    assert t.lookup("softmax", "bfloat16", {"rows": 1024, "cols": 4096}) is e4096
    assert t.lookup("softmax", "bfloat16", {"rows": 1025, "cols": 4096}) is None
    assert t.lookup("softmax", "bfloat16", {"rows": 7, "cols": 4096}) is None


def test_build_refuses_a_range_whose_largest_point_was_never_checked():
    """An entry for rows [8, 1024] measured at 8 and 256 is certified only once 1024x4096 was
    correctness-checked for that variant, config and dtype."""
    from kernelsearch.table import largest_point, uncertified

    cfg = {"ROWS": 1, "num_warps": 4}
    rows = [{"shape": [m, 4096], "dtype": "bfloat16", "variant": "row", "config": cfg,
             "time_s": 5e-6, "baseline_s": 8e-6, "checked": [[m, 4096]]} for m in (8, 256)]
    rows.append({"shape": [4096, 4096], "dtype": "bfloat16", "variant": None, "config": None,
                 "time_s": 0, "baseline_s": 1e-5})
    with pytest.raises(TableError, match="largest point 1024x4096 was not correctness-checked"):
        build("softmax", rows)
    (e,) = plan("softmax", rows)
    assert largest_point(e) == (1024, 4096) and uncertified([e], {}) == [(e, (1024, 4096))]
    # checked for another dtype or config: still refused
    with pytest.raises(TableError):
        build("softmax", rows, checked=[("row", cfg, "float16", (1024, 4096))])
    with pytest.raises(TableError):
        build("softmax", rows, checked=[("row", dict(cfg, num_warps=8), "bfloat16", (1024, 4096))])
    (e,) = build("softmax", rows, checked=[{"variant": "row", "config": cfg, "dtype": "bfloat16",
                                             "shape": [1024, 4096]}])
    assert e.ranges == {"rows": [8, 1024]}


def test_build_never_stretches_a_range_past_the_variants_constraints():
    """A skinny matmul (offered for M <= 16) winning at M = 16 between torch at M = 1 and
    M = 4096 covers [5, 16], not the midpoint range [5, 256]; a tiled win keeps its midpoints."""
    cfg = {"BLOCK_N": 32, "BLOCK_K": 256, "SPLIT_K": 1, "STAGES": 5, "num_warps": 4}
    assert get("matmul").variant("skinny").valid(cfg, (16, 4096, 4096))
    rows = [{"shape": [m, 4096, 4096], "dtype": "bfloat16", "variant": v, "config": c,
             "time_s": t, "baseline_s": 10e-6}
            for m, v, c, t in [(1, None, {}, 11e-6), (16, "skinny", cfg, 8e-6),
                               (4096, None, {}, 11e-6)]]
    (e,) = plan("matmul", rows)
    assert e.ranges == {"M": [5, 16]}
    tiled = {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 8, "STAGES": 3,
             "num_warps": 4}
    rows[1].update(variant="tiled", config=tiled)
    (e,) = plan("matmul", rows)
    assert e.ranges == {"M": [5, 256]}  # tiled 16x64 tiles are offered up to M = 511
    # BLOCK_M 64 is refused below M = 33 and 64-wide N tiles from M = 512: [9, 512] shrinks
    rows[1].update(shape=[64, 4096, 4096], config=dict(tiled, BLOCK_M=64))
    (e,) = plan("matmul", rows)
    assert e.ranges == {"M": [33, 511]}


@pytest.mark.parametrize("name", ["h200.json", "h200-graphs.json"])
def test_shipped_h200_tables_load(name):
    from pathlib import Path

    p = Path(__file__).resolve().parents[2] / "host_profiles" / "kernels" / name
    t = DispatchTable.load(p)
    assert t.entries and {e.family for e in t.entries} >= {"softmax", "rmsnorm", "swiglu"}
    assert all(e.measured for e in t.entries)
    # the model dims of a Llama-8B-style decode step are covered
    assert t.lookup("rmsnorm", "bfloat16", {"rows": 4096, "cols": 4096}) is not None
