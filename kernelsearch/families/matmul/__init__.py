"""bf16 matmul: forward(a, b) = a @ b with a [M, K], b [K, N] (any strides; the shapes here use
b = W.t() of a row-major [N, K] weight, as F.linear does). Compute-bound except at decode sizes."""
from __future__ import annotations

from pathlib import Path

from kernelsearch.families.base import Family, Variant, pow2_at_least, randn

HERE = Path(__file__).parent
SMEM = 200 * 1024  # shared memory budget per program (H200: 227 KB), keep margin


def make_inputs(shape, dtype, device, gen, dist="normal"):
    M, N, K = shape
    a = randn((M, K), dtype, device, gen, dist)
    w = randn((N, K), dtype, device, gen, "normal", scale=K ** -0.5)
    return (a, w.t())


def reference(a, b):
    return a.double() @ b.double()


def torch_default(a, b):
    import torch

    return torch.matmul(a, b)


def _tiled_valid(cfg, shape):
    M = shape[0]
    bm, bn, bk, st = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"], cfg["STAGES"]
    if (bm * bk + bk * bn) * 2 * st > SMEM:
        return False
    if bm > max(16, pow2_at_least(M)) or (M >= 512 and bm < 64):
        return False
    if M >= 512 and (bn < 128 or bk < 64):
        return False
    if M < 512 and st > 4:
        return False
    big = bm * bn >= 128 * 128
    return cfg["num_warps"] == (8 if big else 4)


def _splitk_valid(cfg, shape):
    M = shape[0]
    if M > 64 or cfg["BLOCK_M"] < min(64, pow2_at_least(M)):
        return False
    bm, bn, bk, st = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"], cfg["STAGES"]
    return (bm * bk + bk * bn) * 2 * st <= SMEM and cfg["BLOCK_M"] <= max(16, pow2_at_least(M))


FAMILY = Family(
    name="matmul",
    signature="forward(a, b)",
    dtypes=("bfloat16", "float16"),
    variants={
        "tiled": Variant("tiled", HERE / "tiled.py",
                         {"BLOCK_M": [16, 64, 128], "BLOCK_N": [64, 128, 256],
                          "BLOCK_K": [64, 128], "GROUP_M": [8], "STAGES": [3, 4, 5],
                          "num_warps": [4, 8]}, _tiled_valid),
        "splitk": Variant("splitk", HERE / "splitk.py",
                          {"BLOCK_M": [16, 32, 64], "BLOCK_N": [32, 64, 128],
                           "BLOCK_K": [64, 128, 256], "SPLIT_K": [1, 2, 4, 8],
                           "STAGES": [3, 4], "num_warps": [4]}, _splitk_valid),
    },
    search_shapes=[(4096, 4096, 4096), (8192, 8192, 8192), (3000, 7000, 5000),
                   (1, 4096, 4096), (8, 6144, 4096), (8, 28672, 8192), (8, 4096, 14336),
                   (16, 4096, 4096)],
    sweep_shapes=[(4096, 4096, 4096), (8192, 8192, 8192), (3000, 7000, 5000),
                  (1, 4096, 4096), (8, 6144, 4096), (8, 28672, 8192), (8, 4096, 14336),
                  (16, 4096, 4096)],
    heldout_shapes=[(17, 1000, 333), (129, 257, 4096), (5, 4097, 1000), (600, 700, 800)],
    tiny_shapes=[(5, 33, 40), (16, 16, 64), (1, 50, 70), (20, 40, 24)],
    make_inputs=make_inputs,
    reference=reference,
    torch_default=torch_default,
    out_spec=lambda a, b: ((a.shape[0], b.shape[1]), a.dtype),
    bytes_moved=lambda s, es: (s[0] * s[2] + s[2] * s[1] + s[0] * s[1]) * es,
    flops=lambda s: 2.0 * s[0] * s[1] * s[2],
    shape_of=lambda a, b: (a.shape[0], b.shape[1], a.shape[1]),
    shape_dims=("M", "N", "K"),
    exact_dims=("N", "K"),
    range_dims=("M",),
    bound="compute",
)
