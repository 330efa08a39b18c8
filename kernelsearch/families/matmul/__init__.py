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


def layout_of(a, b) -> str:
    """'t': b is W.t() of a row-major [N, K] weight (K contiguous: F.linear, nn.Linear storage,
    what make_inputs builds); 'n': b is a row-major [K, N] matrix; 's': anything else. A must
    have unit stride along K. Size-1 dims have arbitrary strides, so they match either."""
    K, N = b.shape
    if a.dim() != 2 or not (a.stride(1) == 1 or K == 1):
        return "s"
    if b.stride(0) == 1 or K == 1:
        return "t"
    if b.stride(1) == 1 or N == 1:
        return "n"
    return "s"


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


SMEM_HOPPER = 227 * 1024 - 4096  # H200 per-block limit, less room for barriers


def _persistent_valid(cfg, shape):
    """Persistent TMA tiles: compute-bound products (M > 16; decode shapes go to `skinny`);
    operand stages plus the epilogue tile must fit shared memory; a 128x256 fp32 accumulator
    needs two warpgroups; the half-width epilogue only matters for 256-wide tiles."""
    if shape[0] <= 16:
        return False
    bm, bn, bk, st = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"], cfg["STAGES"]
    epi = bm * bn * 2 // (2 if cfg["SUBTILE"] else 1)
    if (bm * bk + bk * bn) * 2 * st + epi > SMEM_HOPPER:
        return False
    if cfg["SUBTILE"] and bn < 256:
        return False
    return cfg["num_warps"] == 8 if bn >= 256 else True


def _skinny_valid(cfg, shape):
    """Decode-shaped products (M <= 16): enough programs to cover the SMs a few times over
    (where N is large enough to), and each K slice at least two tiles long."""
    M, N, K = shape
    if M > 16:
        return False
    bn, bk, sk, st = cfg["BLOCK_N"], cfg["BLOCK_K"], cfg["SPLIT_K"], cfg["STAGES"]
    if (16 * bk + bn * bk) * 2 * st > SMEM:
        return False
    if sk > 1 and K < 2 * bk * sk:
        return False
    progs = -(-N // bn) * sk
    return N < 2048 or 128 <= progs <= 4096


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
        "persistent": Variant("persistent", HERE / "persistent.py",
                              {"BLOCK_M": [128], "BLOCK_N": [128, 256], "BLOCK_K": [64, 128],
                               "GROUP_M": [8], "STAGES": [3, 4], "NUM_SMS": [132],
                               "SUBTILE": [0, 1], "num_warps": [4, 8]}, _persistent_valid),
        "skinny": Variant("skinny", HERE / "skinny.py",
                          {"BLOCK_N": [16, 32, 64], "BLOCK_K": [256, 512], "SPLIT_K": [1, 2, 4],
                           "STAGES": [3, 5], "num_warps": [4, 8]}, _skinny_valid),
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
    layout_of=layout_of,
    layout="t",
    # BLOCK_M 16..128 (skinny: 16-row slices), BLOCK_N 16..256, BLOCK_K 64..512 and split-K
    # slices: one past each, the other dims small
    edges={"M": (16, 64, 128, 256), "N": (16, 32, 64, 128, 256), "K": (64, 128, 256, 512, 1024)},
    cheap=(5, 33, 40),
)
