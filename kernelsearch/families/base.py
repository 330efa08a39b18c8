"""What every kernel family provides: reference, variants, space, shapes, tolerances, roofline."""
from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

Shape = tuple  # family-specific tuple of ints (e.g. (rows, cols) or (M, N, K))

# Tolerances by output dtype: (atol, rtol) elementwise against the float64 reference, plus a bound
# on ||out - ref|| / ||ref||. fp32 math lands far under 1e-5; bf16 output rounding is 2^-8.
TOLERANCES: dict[str, tuple[float, float, float]] = {
    "float32": (1e-5, 1e-4, 2e-5),
    "float16": (2e-3, 4e-3, 2e-3),
    "bfloat16": (1.6e-2, 1.6e-2, 1e-2),
}

# Value distributions the correctness stage draws from (fresh seed every check).
DISTRIBUTIONS = ("normal", "uniform_wide", "outliers", "small")


@dataclass(frozen=True)
class Scalar:
    """A scalar argument as users pass it: the model presets the project ships first, then
    values drawn from its real range (log-uniform when `log`)."""

    presets: tuple[float, ...]
    lo: float
    hi: float
    log: bool = False

    def draw(self, rng: random.Random) -> float:
        if self.log:
            return math.exp(rng.uniform(math.log(self.lo), math.log(self.hi)))
        return rng.uniform(self.lo, self.hi)

    def cycle(self, rng: random.Random):
        """Every preset once in a random order, then a random value, and again: a kernel that
        hard-codes one preset meets the others within a few checks."""
        ps = list(self.presets)
        rng.shuffle(ps)
        while True:
            yield from ps
            yield self.draw(rng)


@dataclass(frozen=True)
class Variant:
    """One kernel implementation: a candidate-format source file plus its parameter space."""

    name: str
    file: Path
    dims: dict[str, list]  # parameter -> allowed values
    valid: Callable[[dict, Shape], bool] = lambda cfg, shape: True
    # "triton" (a @triton.jit source the guard reads) or "library": a shipped wrapper over an
    # installed library kernel (kernelsearch.families.library), offered only where `library`
    # imports; `dtypes` limits the family's dtypes for it (empty: all of them)
    kind: str = "triton"
    library: str = ""
    dtypes: tuple[str, ...] = ()
    # library variants: the nearest shape the library takes (the judge checks the family's
    # boundary shapes through it: a page of 64, a head count the library has kernels for)
    fit: Optional[Callable[[Shape], Shape]] = None
    # Gluon variants (kernelsearch.families.gluon): compiled only, for sm_90 (no interpreter
    # path); `valid` offers them only where that holds, `tile_valid` is the tile rule alone
    gpu_only: bool = False
    tile_valid: Optional[Callable[[dict, Shape], bool]] = None

    def configs(self, shape: Optional[Shape] = None) -> list[dict]:
        keys = list(self.dims)
        out = []
        for vals in itertools.product(*(self.dims[k] for k in keys)):
            cfg = dict(zip(keys, vals))
            if shape is None or self.valid(cfg, shape):
                out.append(cfg)
        return out


@dataclass
class Family:
    name: str
    signature: str  # e.g. "forward(x, weight, eps)"
    dtypes: tuple[str, ...]
    variants: dict[str, Variant]
    search_shapes: list[Shape]  # used by the search
    heldout_shapes: list[Shape]  # never searched on: final correctness checks only
    tiny_shapes: list[Shape]  # for the CPU interpreter (CI)
    make_inputs: Callable[..., tuple]  # (shape, dtype, device, gen, dist) -> args tuple
    reference: Callable[..., Any]  # float64 reference on the same args
    torch_default: Callable[..., Any]  # the plain torch op (dispatch fallback, eager baseline)
    out_spec: Callable[..., tuple]  # args -> (shape tuple, torch dtype)
    bytes_moved: Callable[[Shape, int], float]  # fewest bytes through memory (read + write)
    flops: Callable[[Shape], float]
    shape_of: Callable[..., Shape]  # args -> shape tuple (inverse of make_inputs)
    shape_dims: tuple[str, ...]  # names of the shape tuple's entries
    exact_dims: tuple[str, ...]  # dims a dispatch entry matches exactly (model dims)
    range_dims: tuple[str, ...]  # dims a dispatch entry covers by a validated range
    bound: str = "memory"  # "memory" or "compute"
    sweep_shapes: list[Shape] = field(default_factory=list)  # benchmark sweep (GPU)
    # args -> the operands' memory layout, for families whose kernels' speed depends on it.
    # Everything is searched, judged and timed on make_inputs's layout (`layout`), so dispatch
    # runs a table kernel only on that layout and hands any other to torch.
    layout_of: Optional[Callable[..., str]] = None
    layout: str = ""
    # ref -> the per-element scale atol is relative to (default: the RMS of the whole
    # reference). Families whose output holds independent problems of very different
    # magnitudes (attention over ragged lengths: one token vs 128k) give each its own.
    scale_of: Optional[Callable[[Any], Any]] = None
    # Boundary coverage (`boundary_shapes`): per dim, the powers of two that the variants' block
    # sizes, split lengths and grids are built from (a bug at a block edge shows one past it);
    # the cheap value of every dim that a boundary shape keeps in its other dims; the largest
    # value per dim the CPU interpreter is asked to run (it executes one program at a time, so a
    # grid of 4097 row programs costs seconds per call); `fit` makes a shape consistent (GQA:
    # HQ a multiple of HKV, even rope D).
    edges: dict[str, tuple[int, ...]] = field(default_factory=dict)
    cheap: Optional[Shape] = None
    interp_max: dict[str, int] = field(default_factory=dict)
    fit: Optional[Callable[[Shape], Shape]] = None
    # scalar arguments (position in the signature -> its real range and presets): the judge
    # replaces make_inputs's value with draws from it (MLA scale, rmsnorm eps)
    scalars: dict[int, Scalar] = field(default_factory=dict)
    # further boundary shapes for what is no single shape dim (MLA: page count = L / P)
    edge_shapes: list[Shape] = field(default_factory=list)
    # ragged batches: the argument holding the lengths and those whose dim 0 is the batch (the
    # judge reorders the batch so the longest sequence comes first, last or in the middle)
    lengths_arg: Optional[int] = None
    batch_args: tuple[int, ...] = ()

    def tolerance(self, dtype: str) -> tuple[float, float, float]:
        return TOLERANCES[dtype]

    def variant(self, name: str) -> Variant:
        if name not in self.variants:
            raise KeyError(f"family {self.name!r} has no variant {name!r}; "
                           f"expected one of {sorted(self.variants)}")
        return self.variants[name]

    def space(self, shape: Optional[Shape] = None) -> list[tuple[str, dict]]:
        """Every valid (variant, config) for a shape: the exhaustive grid."""
        return [(v.name, c) for v in self.variants.values() for c in v.configs(shape)]

    def dims_dict(self, shape: Shape) -> dict[str, int]:
        return dict(zip(self.shape_dims, shape))

    def boundary_shapes(self, claimed: Sequence[Shape] = (), device: str = "cpu"
                        ) -> tuple[list[Shape], list[Shape]]:
        """Deterministic shapes the correctness stage always checks, cheap in every dim but one:
        one past each declared edge of every dim, and the largest value of every dim that a
        `claimed` shape (timed shape, search bucket, table range end, --shape) takes. Returns
        (to check, skipped): on the CPU interpreter, edge shapes past `interp_max` are skipped
        (and reported); a claimed maximum is never skipped (the caller asked for that size)."""
        base = tuple(self.cheap or self.tiny_shapes[0])
        fit = self.fit or (lambda s: s)
        out: list[Shape] = []
        skipped: list[Shape] = []

        def add(shape: Shape, where: list) -> None:
            shape = tuple(fit(tuple(shape)))
            if shape not in out and shape not in skipped:
                where.append(shape)

        def over(s: Shape) -> bool:
            return device != "cuda" and any(
                self.interp_max.get(d) is not None and s[i] > self.interp_max[d]
                for i, d in enumerate(self.shape_dims))

        for i, d in enumerate(self.shape_dims):
            for e in self.edges.get(d, ()):
                s = base[:i] + (e + 1,) + base[i + 1:]
                add(s, skipped if over(s) else out)
        for s in self.edge_shapes:
            add(tuple(s), skipped if over(tuple(s)) else out)
        for i, d in enumerate(self.shape_dims):
            top = max((int(c[i]) for c in claimed), default=0)
            if top > base[i]:
                s = tuple(fit(base[:i] + (top,) + base[i + 1:]))
                if s in skipped:
                    skipped.remove(s)
                add(s, out)
        return out, skipped


    def range_shapes(self, match: dict, ranges: dict, rng: random.Random) -> list[Shape]:
        """Where a table range is checked besides its ends: for each range dim, its arithmetic
        midpoint, the geometric midpoint and a random point of every octave [2^k, 2^(k+1)] it
        overlaps (a kernel wrong only for 5,001-8,000 rows of 8-65,536 meets 5,793), the other
        range dims at their low end and the exact dims as matched (the sizes the entry is
        used at); other dims at the cheap shape."""
        base = dict(zip(self.shape_dims, self.cheap or self.tiny_shapes[0]))
        base.update(match)
        lows = {k: int(r[0]) for k, r in ranges.items()}
        fit = self.fit or (lambda s: s)
        out: list[Shape] = []
        for d, (lo, hi) in ranges.items():
            lo, hi = int(lo), int(hi)
            pts = {lo, hi, (lo + hi) // 2}
            k = max(0, int(math.log2(max(lo, 1))))
            while (1 << k) <= hi:
                a, b = max(lo, 1 << k), min(hi, (1 << (k + 1)))
                if a <= b:
                    pts.add(min(b, max(a, int(round(2 ** (k + 0.5))))))
                    pts.add(rng.randint(a, b))
                k += 1
            for v in sorted(pts):
                dims = dict(base, **lows)
                dims[d] = v
                s = tuple(fit(tuple(dims[x] for x in self.shape_dims)))
                if s not in out:
                    out.append(s)
        return out


LAYOUTS = ("contiguous", "offset", "unaligned", "row_strided", "transposed")
PAD_VALUE = 300.0  # what the padding around a view holds: a kernel that reads it is wrong by far


def relayout(t, kind: str):
    """t's values in another memory layout, as a user's tensor may come: `offset` (a view 64
    elements into a larger buffer), `unaligned` (1 element in: not 16-byte aligned),
    `row_strided` (rows padded: a slice of a wider tensor), `transposed` (the last two dims
    swapped in memory: last stride != 1). The spare memory holds PAD_VALUE (or -1)."""
    import torch

    if kind == "contiguous" or not isinstance(t, torch.Tensor) or t.dim() == 0 \
            or t.numel() == 0:
        return t
    fill = PAD_VALUE if t.is_floating_point() else -1
    if kind in ("offset", "unaligned"):
        k = 64 if kind == "offset" else 1
        buf = torch.full((t.numel() + k,), fill, dtype=t.dtype, device=t.device)
        v = buf[k:].view(t.shape)
    elif kind == "row_strided":
        shape = tuple(t.shape)
        buf = torch.full(shape[:-1] + (shape[-1] + 3,), fill, dtype=t.dtype, device=t.device)
        v = buf[..., :shape[-1]]
    elif kind == "transposed":
        if t.dim() < 2:
            buf = torch.full((t.numel() * 2,), fill, dtype=t.dtype, device=t.device)
            v = buf[::2]
        else:
            shape = tuple(t.shape)
            buf = torch.full(shape[:-2] + (shape[-1], shape[-2]), fill, dtype=t.dtype,
                             device=t.device)
            v = buf.transpose(-1, -2)
    else:
        raise ValueError(f"unknown layout {kind!r}; expected one of {LAYOUTS}")
    v.copy_(t)
    return v


def dtype_of(name: str):
    import torch

    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[name]


def dtype_name(dt) -> str:
    return str(dt).replace("torch.", "")


def element_size(dtype: str) -> int:
    return {"float32": 4, "float16": 2, "bfloat16": 2}[dtype]


def randn(shape, dtype, device, gen, dist: str, scale: float = 1.0):
    """Random values of a named distribution, drawn in float32 on the CPU from `gen` (so one seed
    gives one input on any device), then cast. Never zeros: they hide unwritten outputs."""
    import torch

    # a sub-seed from `gen`, then a generator on the target device (GPU-sized inputs are drawn
    # there: drawing 1 GB on the CPU would dominate a benchmark)
    sub = int(torch.randint(0, 2 ** 62, (1,), generator=gen))
    g = torch.Generator(device=device).manual_seed(sub)
    kw = dict(generator=g, device=device)
    # in place: one float32 copy at a time (a 128 x 163,840 MLA cache is 45 GiB of it; out of
    # place, "small" held two and its largest check peaked at 108 GiB on the H200)
    if dist == "normal":
        t = torch.randn(shape, **kw)
    elif dist == "uniform_wide":
        t = torch.rand(shape, **kw).mul_(2).sub_(1).mul_(30.0)
    elif dist == "outliers":
        t = torch.randn(shape, **kw)
        mask = torch.rand(shape, **kw) < 0.01
        t[mask] = t[mask] * 50.0
    elif dist == "small":
        t = torch.randn(shape, **kw).mul_(1e-2).add_(1e-3)
    else:
        raise ValueError(f"unknown distribution {dist!r}; expected one of {DISTRIBUTIONS}")
    if scale != 1.0:
        t.mul_(scale)
    return t.to(dtype=dtype_of(dtype) if isinstance(dtype, str) else dtype)


def pow2_at_least(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(1, n))))
