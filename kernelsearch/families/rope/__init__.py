"""rope: forward(x, cos, sin), the rotary embedding of one decode token's q and k heads in one
launch. x (B, NH, D), NH = query + kv heads (the q|k part of a fused QKV output: a strided view
whose row stride exceeds NH*D, or contiguous); cos, sin float32 (B, D/2) or (1, D/2), broadcast
over heads. Pairs are (first half, second half) of D, fp32 math (Llama.apply_rope):
out1 = x1*cos - x2*sin, out2 = x2*cos + x1*sin; a new contiguous (B, NH, D) of x's dtype.
Memory-bound: one read of x, one write."""
from __future__ import annotations

from pathlib import Path

from kernelsearch.families.base import Family, Variant, pow2_at_least, randn

HERE = Path(__file__).parent
THETA = 500000.0  # Llama-3's rope base
MAX_POS = 131072

# (NH, D) of real decoders: Llama-3-8B 32+8 heads, Llama-3-70B 64+8, Llama-3-405B 128+8,
# Llama-3.2-1B 32+8 at D 64
SEARCH = [(b, nh, 128) for nh in (40, 72) for b in (1, 8, 64, 256)]
SWEEP = SEARCH + [(512, 40, 128), (8, 136, 128), (64, 136, 128), (8, 40, 64)]
HELDOUT = [(3, 40, 128), (37, 72, 128), (100, 48, 128), (5, 12, 64), (2, 136, 128), (7, 20, 80)]
TINY = [(2, 6, 16), (3, 5, 34), (1, 3, 8)]


def make_inputs(shape, dtype, device, gen, dist="normal"):
    """x as the model hands it over (a strided q|k view of a QKV row with v heads after it;
    contiguous for the "small" draw); cos/sin of real angles at random positions: one position
    broadcast over the batch (a decode step) or one per sequence (uniform_wide, outliers). The
    layout follows the shape and distribution only, so a second draw can be copied in place."""
    import torch

    B, NH, D = shape
    if dist == "small":
        x = randn((B, NH, D), dtype, device, gen, dist)
    else:
        nv = max(1, NH // 5)
        x = randn((B, (NH + nv) * D), dtype, device, gen, dist)[:, :NH * D].view(B, NH, D)
    rows = B if dist in ("uniform_wide", "outliers") else 1
    pos = torch.randint(0, MAX_POS, (rows,), generator=gen, dtype=torch.int64).double()
    inv = 1.0 / (THETA ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    ang = pos[:, None] * inv[None, :]
    return (x, ang.cos().float().to(device), ang.sin().float().to(device))


def reference(x, cos, sin):
    import torch

    h = x.shape[-1] // 2
    xd = x.double()
    c, s = cos.double().unsqueeze(-2), sin.double().unsqueeze(-2)
    x1, x2 = xd[..., :h], xd[..., h:]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


def torch_default(x, cos, sin):
    """The same composite ops, in the same order and dtype, as Llama.apply_rope (the plain path
    of the workload), so a fallback call is bit-identical to it."""
    import torch

    h = x.shape[-1] // 2
    c, s = cos.unsqueeze(-2), sin.unsqueeze(-2)
    xf = x.float()
    x1, x2 = xf[..., :h], xf[..., h:]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).type_as(x)


def shape_of(x, cos, sin):
    """(B, NH, D); ValueError for inputs the kernels do not take (dispatch then runs torch)."""
    if x.dim() != 3 or x.shape[-1] % 2:
        raise ValueError(f"rope: x must be (B, NH, D) with even D, got {tuple(x.shape)}")
    B, NH, D = x.shape
    for t in (cos, sin):
        if t.dim() != 2 or t.shape[1] * 2 != D or t.shape[0] not in (1, B):
            raise ValueError(f"rope: cos/sin must be (B or 1, D/2), got {tuple(t.shape)}")
    return (B, NH, D)


def _fit(shape):
    """An even head dim (pairs of halves): D rounded up."""
    B, NH, D = shape
    return (B, NH, D + D % 2)


def _heads_valid(cfg, shape):
    """[BLOCK_H, D/2] pairs per program: no block beyond the heads, at most 32 pairs per thread,
    no idle warps."""
    B, NH, D = shape
    if cfg["BLOCK_H"] > 1 and cfg["BLOCK_H"] > pow2_at_least(NH):
        return False
    per_thread = cfg["BLOCK_H"] * pow2_at_least(D // 2) / (32 * cfg["num_warps"])
    return per_thread <= 32 and (per_thread >= 1 or cfg["num_warps"] == 1)


def _flat_valid(cfg, shape):
    """BLOCK pairs per program: no block beyond the pairs, 1 to 16 pairs per thread."""
    B, NH, D = shape
    n = B * NH * (D // 2)
    if cfg["BLOCK"] > max(128, pow2_at_least(n)):
        return False
    per_thread = cfg["BLOCK"] / (32 * cfg["num_warps"])
    return per_thread <= 16 and (per_thread >= 1 or cfg["num_warps"] == 1)


FAMILY = Family(
    name="rope",
    signature="forward(x, cos, sin)",
    dtypes=("float32", "bfloat16", "float16"),
    variants={
        "heads": Variant("heads", HERE / "heads.py",
                         {"BLOCK_H": [1, 2, 4, 8, 16, 32, 64], "num_warps": [1, 2, 4, 8]},
                         _heads_valid),
        "flat": Variant("flat", HERE / "flat.py",
                        {"BLOCK": [128, 256, 512, 1024, 2048, 4096],
                         "num_warps": [1, 2, 4, 8]}, _flat_valid),
    },
    search_shapes=SEARCH,
    sweep_shapes=SWEEP,
    heldout_shapes=HELDOUT,
    tiny_shapes=TINY,
    make_inputs=make_inputs,
    reference=reference,
    torch_default=torch_default,
    out_spec=lambda x, cos, sin: (tuple(x.shape), x.dtype),
    # fewest bytes: x read and written once, cos/sin one float32 row each (broadcast)
    bytes_moved=lambda s, es: 2.0 * s[0] * s[1] * s[2] * es + 4.0 * s[2],
    flops=lambda s: 3.0 * s[0] * s[1] * s[2],
    shape_of=shape_of,
    shape_dims=("B", "NH", "D"),
    exact_dims=("NH", "D"),
    range_dims=("B",),
    # B: the heads variant's grid rows; NH past BLOCK_H 16..64; D past the half-width power of
    # two (HALF 32/64/128; `_fit` makes D even); the flat variant's BLOCK spans B*NH*D/2
    edges={"B": (64, 256), "NH": (16, 32, 64, 128), "D": (64, 128, 256)},
    cheap=(1, 3, 8),
    interp_max={"B": 65, "NH": 65},
    fit=_fit,
)
