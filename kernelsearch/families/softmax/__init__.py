"""softmax over the last dim: forward(x). Memory-bound: one read, one write."""
from __future__ import annotations

from pathlib import Path

from kernelsearch.families import rowwise
from kernelsearch.families.base import Family, Variant, randn

HERE = Path(__file__).parent


def make_inputs(shape, dtype, device, gen, dist="normal"):
    return (randn(shape, dtype, device, gen, dist),)


def reference(x):
    import torch

    return torch.softmax(x.double(), dim=-1)


def torch_default(x):
    import torch

    return torch.softmax(x, dim=-1)


FAMILY = Family(
    name="softmax",
    signature="forward(x)",
    dtypes=("float32", "bfloat16", "float16"),
    variants={
        "row": Variant("row", HERE / "row.py",
                       {"ROWS": [1, 2, 4, 8], "num_warps": [1, 2, 4, 8, 16, 32]},
                       rowwise.row_valid),
        "online": Variant("online", HERE / "online.py",
                          {"BLOCK": [128, 256, 512, 1024, 2048, 4096], "STAGES": [1, 2, 3],
                           "num_warps": [4, 8, 16]}, rowwise.looped_valid),
        "streamed": Variant("streamed", HERE / "streamed.py",
                            {"BLOCK": [512, 1024, 2048, 4096, 8192], "STAGES": [1, 2],
                             "num_warps": [4, 8, 16]}, rowwise.looped_valid),
        "split": Variant("split", HERE / "split.py", {"num_warps": [4, 8, 16, 32]},
                         rowwise.split_valid),
    },
    search_shapes=rowwise.SWEEP,
    sweep_shapes=rowwise.SWEEP,
    heldout_shapes=rowwise.HELDOUT,
    tiny_shapes=rowwise.TINY,
    make_inputs=make_inputs,
    reference=reference,
    torch_default=torch_default,
    out_spec=lambda x: (tuple(x.shape), x.dtype),
    bytes_moved=lambda s, es: 2.0 * s[0] * s[1] * es,
    flops=lambda s: 5.0 * s[0] * s[1],
    shape_of=lambda x: (x.numel() // x.shape[-1], x.shape[-1]),
    shape_dims=("rows", "cols"),
    exact_dims=("cols",),
    range_dims=("rows",),
    edges=rowwise.EDGES,
    cheap=rowwise.CHEAP,
    interp_max=rowwise.INTERP_MAX,
)
