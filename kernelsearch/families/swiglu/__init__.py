"""swiglu: forward(gate, up) = silu(gate) * up. Memory-bound: two reads, one write."""
from __future__ import annotations

from pathlib import Path

from kernelsearch.families import rowwise
from kernelsearch.families.base import Family, Variant, randn

HERE = Path(__file__).parent


def make_inputs(shape, dtype, device, gen, dist="normal"):
    return (randn(shape, dtype, device, gen, dist), randn(shape, dtype, device, gen, "normal"))


def reference(gate, up):
    import torch

    # in place on a fresh float64 copy: the largest sweep shape's reference stays 3 copies
    g = gate.to(torch.float64, copy=True)
    return g.mul_(g.sigmoid()).mul_(up.double())


def torch_default(gate, up):
    import torch.nn.functional as F

    return F.silu(gate) * up


def _flat_valid(cfg, shape):
    n = shape[0] * shape[1]
    return cfg["BLOCK"] <= max(1024, 4 * n) and cfg["BLOCK"] / (32 * cfg["num_warps"]) <= 32


def _rows_valid(cfg, shape):
    if cfg["BLOCK_C"] > max(256, 2 * shape[1]) or cfg["BLOCK_R"] > max(1, shape[0]):
        return False
    return cfg["BLOCK_R"] * cfg["BLOCK_C"] / (32 * cfg["num_warps"]) <= 32


FAMILY = Family(
    name="swiglu",
    signature="forward(gate, up)",
    dtypes=("float32", "bfloat16", "float16"),
    variants={
        "flat": Variant("flat", HERE / "flat.py",
                        {"BLOCK": [256, 512, 1024, 2048, 4096, 8192],
                         "num_warps": [1, 2, 4, 8, 16]}, _flat_valid),
        "rows": Variant("rows", HERE / "rows.py",
                        {"BLOCK_R": [1, 4, 16], "BLOCK_C": [256, 1024, 4096],
                         "num_warps": [2, 4, 8, 16]}, _rows_valid),
    },
    search_shapes=rowwise.SWEEP + [(8, 14336)],
    sweep_shapes=rowwise.SWEEP + [(8, 14336)],
    heldout_shapes=rowwise.HELDOUT,
    tiny_shapes=rowwise.TINY,
    make_inputs=make_inputs,
    reference=reference,
    torch_default=torch_default,
    out_spec=lambda g, u: (tuple(g.shape), g.dtype),
    bytes_moved=lambda s, es: 3.0 * s[0] * s[1] * es,
    flops=lambda s: 6.0 * s[0] * s[1],
    shape_of=lambda g, u: (g.numel() // g.shape[-1], g.shape[-1]),
    shape_dims=("rows", "cols"),
    exact_dims=("cols",),
    range_dims=("rows",),
    edges=rowwise.EDGES,
    cheap=rowwise.CHEAP,
    interp_max=rowwise.INTERP_MAX,
)
