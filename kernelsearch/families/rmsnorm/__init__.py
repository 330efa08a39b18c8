"""rmsnorm: forward(x, weight, eps) = x / sqrt(mean(x^2, -1) + eps) * weight. Memory-bound."""
from __future__ import annotations

from pathlib import Path

from kernelsearch.families import rowwise
from kernelsearch.families.base import Family, Scalar, Variant, randn

HERE = Path(__file__).parent
EPS = 1e-6
# the epsilons users pass: Llama 3 (and the Llama workload) 1e-5, DeepSeek/Qwen 1e-6, then any
# in the range models use
EPSILONS = Scalar((1e-5, 1e-6), 1e-8, 1e-4, log=True)


def make_inputs(shape, dtype, device, gen, dist="normal"):
    x = randn(shape, dtype, device, gen, dist)
    w = randn((shape[1],), dtype, device, gen, "normal") * 0.5 + 1.0
    return (x, w, EPS)


def reference(x, weight, eps):
    import torch

    xd = x.to(torch.float64, copy=True)  # fresh: scaled in place (the largest sweep shape)
    r = (xd.pow(2).mean(-1, keepdim=True) + eps).rsqrt()
    return xd.mul_(r).mul_(weight.double())


def torch_default(x, weight, eps):
    import torch.nn.functional as F

    return F.rms_norm(x, (x.shape[-1],), weight, eps)


FAMILY = Family(
    name="rmsnorm",
    signature="forward(x, weight, eps)",
    dtypes=("float32", "bfloat16", "float16"),
    variants={
        "row": Variant("row", HERE / "row.py",
                       {"ROWS": [1, 2, 4, 8], "num_warps": [1, 2, 4, 8, 16, 32]},
                       rowwise.row_valid),
        "looped": Variant("looped", HERE / "looped.py",
                          {"BLOCK": [128, 256, 512, 1024, 2048, 4096], "STAGES": [1, 2, 3],
                           "num_warps": [4, 8, 16]}, rowwise.looped_valid),
        "streamed": Variant("streamed", HERE / "streamed.py",
                            {"BLOCK": [256, 512, 1024, 2048, 4096, 8192], "STAGES": [1, 2],
                             "num_warps": [4, 8, 16]}, rowwise.looped_valid),
    },
    search_shapes=rowwise.SWEEP,
    sweep_shapes=rowwise.SWEEP,
    heldout_shapes=rowwise.HELDOUT,
    tiny_shapes=rowwise.TINY,
    make_inputs=make_inputs,
    reference=reference,
    torch_default=torch_default,
    out_spec=lambda x, w, eps: (tuple(x.shape), x.dtype),
    bytes_moved=lambda s, es: (2.0 * s[0] * s[1] + s[1]) * es,
    flops=lambda s: 4.0 * s[0] * s[1],
    shape_of=lambda x, w, eps: (x.numel() // x.shape[-1], x.shape[-1]),
    shape_dims=("rows", "cols"),
    exact_dims=("cols",),
    range_dims=("rows",),
    edges=rowwise.EDGES,
    cheap=rowwise.CHEAP,
    interp_max=rowwise.INTERP_MAX,
    scalars={2: EPSILONS},
)
