"""MLA decode where users run it (issue 45): tensor-parallel head counts (16 / 32 a GPU), two
query tokens a step (multi-token prediction) and ragged batches (a length drawn per request).
Every Triton variant of the four MLA families against the float64 reference under the CPU
interpreter at those cases, small and quick; and the families' declarations covering them, so
the judge's shape draws and the benchmark tables reach them."""
import importlib

import pytest
import torch

from kernelsearch.families import get, mla
from kernelsearch.harness.correctness import compare

SMALL = {"BLOCK_H": 16, "BLOCK_N": 16, "GRID": 132, "STAGES": 1, "num_warps": 4}
# (B, H, L, page, ...): 16 and 32 heads, ragged (R = 1: a length drawn per sequence)
CASES = {
    "mla_decode": [(2, 16, 70, 16, 1), (2, 32, 40, 16, 1)],
    "mla_decode_mtp": [(2, 16, 40, 16, 2, 1), (2, 32, 40, 16, 2, 1), (2, 16, 40, 16, 1, 1)],
    "mla_sparse_decode": [(2, 16, 70, 16, 24, 1), (2, 32, 40, 16, 24, 1)],
    "mla_sparse_decode_fp8": [(2, 16, 70, 16, 24, 1), (2, 32, 40, 16, 24, 1)],
}


def _interpreted(fam):
    return [v for v in fam.variants.values() if v.kind == "triton" and not v.gpu_only]


def _small_config(var, shape):
    cfg = {k: vals[0] for k, vals in var.dims.items()}
    cfg.update({k: v for k, v in SMALL.items() if k in var.dims})
    return cfg


PARAMS = [(f, v.name, s) for f, shapes in CASES.items() for v in _interpreted(get(f))
          for s in shapes]


@pytest.mark.parametrize("family,variant,shape", PARAMS,
                         ids=[f"{f}-{v}-{'x'.join(map(str, s))}" for f, v, s in PARAMS])
def test_variant_matches_the_reference_at_tensor_parallel_heads_mtp_and_ragged(
        family, variant, shape):
    fam = get(family)
    var = fam.variants[variant]
    cfg = _small_config(var, shape)
    if not var.valid(cfg, shape):  # a variant that cannot take the case says so
        pytest.skip(f"{variant} declares it does not take {shape}")
    args = fam.make_inputs(shape, "float16", "cpu", torch.Generator().manual_seed(3), "normal")
    lens = args[3]
    if shape[-1]:
        assert len(set(lens.tolist())) > 1, "a ragged batch draws a length per sequence"
    fwd = importlib.import_module(f"kernelsearch.families.{family}.{variant}").forward
    out = fwd(*args, **cfg)
    compare(out, fam.reference(*args), "float16", fam, f"{family}/{variant} {shape}")


@pytest.mark.parametrize("family", list(CASES))
def test_declarations_cover_the_tensor_parallel_heads_and_ragged_batches(family):
    """The search, sweep and CPU shapes the judge and the tables draw from hold every head
    count a GPU holds under tensor parallelism, ragged batches, and (MTP) s_q 1 and 2."""
    fam = get(family)
    dims = fam.shape_dims
    h, r = dims.index("H"), dims.index("R")
    big = fam.search_shapes + fam.sweep_shapes
    assert {s[h] for s in big} >= set(mla.HEADS)
    assert {s[h] for s in fam.tiny_shapes} >= {16, 32}
    assert any(s[r] == 1 for s in fam.sweep_shapes) and any(s[r] == 1 for s in fam.tiny_shapes)
    assert {s[dims.index("L")] for s in fam.sweep_shapes} >= set(mla.CONTEXTS)
    if "S" in dims:
        for shapes in (fam.search_shapes, fam.sweep_shapes, fam.tiny_shapes):
            assert {s[dims.index("S")] for s in shapes} == {1, 2}
    # the judge's boundary shapes go one past every head count a block or a tile is built on
    edges = fam.edges["H"]
    assert set(mla.HEADS) <= set(edges)
