"""Decode attention (one query token per sequence, GQA): forward(q, k, v) with q [B, HQ, D] and a
KV cache k, v [B, HKV, L, D]; scale 1/sqrt(D). Memory-bound on the KV cache."""
from __future__ import annotations

from pathlib import Path

from kernelsearch.families.base import Family, Variant, pow2_at_least, randn

HERE = Path(__file__).parent


def make_inputs(shape, dtype, device, gen, dist="normal"):
    B, HQ, HKV, L, D = shape
    q = randn((B, HQ, D), dtype, device, gen, dist)
    k = randn((B, HKV, L, D), dtype, device, gen, dist)
    v = randn((B, HKV, L, D), dtype, device, gen, "normal")
    return (q, k, v)


def reference(q, k, v):
    """float64, per kv head group and sequence (no repeat of K/V: a 128k-token cache stays
    affordable)."""
    import torch

    B, HQ, D = q.shape
    HKV = k.shape[1]
    out = []
    for b in range(B):  # one sequence at a time: a float64 copy of 8 x 128k tokens is 17 GB
        qd = q[b].double().view(HKV, HQ // HKV, D)
        kd, vd = k[b].double(), v[b].double()
        s = torch.einsum("kgd,kld->kgl", qd, kd) / D ** 0.5
        out.append(torch.einsum("kgl,kld->kgd", torch.softmax(s, dim=-1), vd).reshape(HQ, D))
    return torch.stack(out)


def torch_default(q, k, v):
    import torch.nn.functional as F

    return F.scaled_dot_product_attention(q.unsqueeze(2), k, v, enable_gqa=True).squeeze(2)


def _fit(shape):
    """A consistent GQA shape: HQ a multiple of HKV (rounded up)."""
    B, HQ, HKV, L, D = shape
    return (B, -(-HQ // HKV) * HKV, HKV, L, D)


def _valid(cfg, shape):
    L = shape[3]
    if cfg["SPLIT"] < cfg["BLOCK_N"] or cfg["SPLIT"] > max(cfg["BLOCK_N"], pow2_at_least(L)):
        return False
    if L // cfg["SPLIT"] > 1024:
        return False
    return cfg["num_warps"] * 32 * 4 <= cfg["BLOCK_N"] * shape[4] or cfg["num_warps"] == 2


def _flashdec_valid(cfg, shape):
    """One-pass merge: at most 128 chunks (their partials are one tile in the merge); K and V
    stages within shared memory."""
    L, D = shape[3], shape[4]
    bn, sp = cfg["BLOCK_N"], cfg["SPLIT"]
    if sp < bn or sp > max(bn, pow2_at_least(L)) or -(-L // sp) > 128:
        return False
    if cfg["STAGES"] * 2 * bn * D * 2 > 160 * 1024:
        return False
    return cfg["num_warps"] * 32 * 4 <= bn * D


FAMILY = Family(
    name="decode_attention",
    signature="forward(q, k, v)",
    dtypes=("bfloat16", "float16"),
    variants={
        "splitkv": Variant("splitkv", HERE / "splitkv.py",
                           {"BLOCK_N": [16, 32, 64, 128], "SPLIT": [128, 256, 512, 1024, 2048],
                            "STAGES": [1, 2, 3], "num_warps": [2, 4, 8]}, _valid),
        "flashdec": Variant("flashdec", HERE / "flashdec.py",
                            {"BLOCK_N": [32, 64, 128], "SPLIT": [128, 256, 512, 1024, 2048],
                             "STAGES": [2, 3, 4], "num_warps": [4, 8]}, _flashdec_valid),
    },
    search_shapes=[(8, 32, 8, 1024, 128), (8, 32, 8, 4096, 128), (8, 32, 8, 16384, 128),
                   (8, 32, 8, 32768, 128), (8, 32, 8, 131072, 128), (1, 32, 8, 8192, 128)],
    sweep_shapes=[(8, 32, 8, 1024, 128), (8, 32, 8, 4096, 128), (8, 32, 8, 16384, 128),
                  (8, 32, 8, 32768, 128), (8, 32, 8, 131072, 128), (1, 32, 8, 8192, 128)],
    heldout_shapes=[(3, 12, 4, 1000, 64), (2, 8, 8, 777, 128), (5, 32, 8, 5000, 128)],
    tiny_shapes=[(2, 4, 2, 37, 16), (1, 8, 2, 70, 32), (2, 2, 2, 20, 16)],
    make_inputs=make_inputs,
    reference=reference,
    torch_default=torch_default,
    out_spec=lambda q, k, v: (tuple(q.shape), q.dtype),
    bytes_moved=lambda s, es: (2.0 * s[0] * s[2] * s[3] * s[4] + 2.0 * s[0] * s[1] * s[4]) * es,
    flops=lambda s: 4.0 * s[0] * s[1] * s[3] * s[4],
    shape_of=lambda q, k, v: (q.shape[0], q.shape[1], k.shape[1], k.shape[2], q.shape[2]),
    shape_dims=("B", "HQ", "HKV", "L", "D"),
    exact_dims=("HQ", "HKV", "D"),
    range_dims=("B", "L"),
    # L: one past every BLOCK_N and SPLIT (and past flashdec's 128-chunk merge tile at SPLIT 128);
    # HQ: query heads per kv head past the 16-row GQA tile; B and HKV past a few programs
    edges={"B": (16,), "HQ": (16, 32), "HKV": (8,),
           "L": (16, 32, 64, 128, 256, 512, 1024, 2048, 16384)},
    cheap=(1, 2, 1, 20, 16),
    interp_max={"L": 2049},
    fit=_fit,
)


# library variants (kernelsearch.families.library): offered where the library imports
from kernelsearch.families import library as _library  # noqa: E402

FLASH_ATTN_HEAD_DIMS = (64, 96, 128, 192, 256)


def _flash_attn_fit(s):
    B, HQ, HKV, L, D = _fit(s)
    return (B, HQ, HKV, L, D if D in FLASH_ATTN_HEAD_DIMS else 64)


FAMILY.variants["flash_attn"] = _library.variant(
    "flash_attn", HERE, "flash_attn",
    fits=lambda s: s[4] in FLASH_ATTN_HEAD_DIMS and s[1] % s[2] == 0,
    dtypes=("bfloat16", "float16"), fit=_flash_attn_fit)
