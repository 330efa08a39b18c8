"""Shapes across the whole range a verdict certifies, drawn new every run (issue 42, item 3).

The judge's fixed lists (tiny, sweep, boundary, held-out) and a few random draws left bands of
the certified range unchecked: a softmax wrong only for 2,500-3,500 rows was accepted, as no
listed shape lands there. So every judgement also checks, from a seed of its own (os.urandom,
recorded in the verdict as `shape_seed`):

- a stratified draw: for every range dim and every octave [2^k, 2^(k+1)) of its range, one
  shape with that dim log-uniform in the octave and one at its geometric midpoint, every other
  range dim log-uniform over its whole range, the exact (model) dims as matched;
- for a table's ranges, their fixed points too (`Family.range_shapes`: ends, midpoints).

So every octave of every dim gets a checked shape in every run, and which ones is never known in
advance. The range certified is the caller's (`judge(ranges=...)`: a table entry's) or, when it
names none, what the verdict vouches for: each checked, claimed or timed shape's range dims from
1 up to that shape's value (not the boundary shapes one past a declared edge: on the CPU
interpreter a large shape costs seconds, so large ones stay few: one or two per octave). A band narrower than an octave can still fall between the draws: the
kernel canary covers that in use (kernelsearch.canary: the first call in every shape bucket)."""
from __future__ import annotations

import math
import random
from typing import Any, Sequence

Shape = tuple[int, ...]


def octaves(lo: int, hi: int) -> list[tuple[int, int]]:
    """[2^k, 2^(k+1)] intersected with [lo, hi], for every k they overlap."""
    lo, hi = max(1, int(lo)), max(1, int(hi))
    out, k = [], int(math.log2(lo))
    while (1 << k) <= hi:
        a, b = max(lo, 1 << k), min(hi, (1 << (k + 1)) - 1)
        if a <= b:
            out.append((a, b))
        k += 1
    return out


def log_uniform(rng: random.Random, lo: int, hi: int) -> int:
    lo, hi = max(1, int(lo)), max(1, int(hi))
    if hi <= lo:
        return lo
    return min(hi, max(lo, int(math.exp(rng.uniform(math.log(lo), math.log(hi + 1))))))


def stratified(family: Any, match: dict, ranges: dict, rng: random.Random) -> list[Shape]:
    """Two shapes per octave of every range dim: that dim log-uniform in the octave, and at
    the octave's geometric midpoint (a band of a third of an octave around it is met in every
    run, not in half of them); the other range dims log-uniform over their whole ranges, the
    matched dims as given, made valid by the family's `fit`."""
    base = dict(zip(family.shape_dims, family.cheap or family.tiny_shapes[0]))
    base.update({k: int(v) for k, v in match.items()})
    fit = family.fit or (lambda s: s)
    out: list[Shape] = []
    for d, (lo, hi) in ranges.items():
        for a, b in octaves(lo, hi):
            for v in (log_uniform(rng, a, b), min(b, max(a, round(math.sqrt(a * (b + 1)))))):
                dims = dict(base)
                for o, (olo, ohi) in ranges.items():
                    dims[o] = log_uniform(rng, olo, ohi)
                dims[d] = v
                s = tuple(int(x) for x in fit(tuple(dims[x] for x in family.shape_dims)))
                if s not in out:
                    out.append(s)
    return out


def certified(family: Any, shapes: Sequence[Sequence[int]]) -> list[dict]:
    """The ranges a verdict without table ranges vouches for: per distinct set of exact dims,
    every range dim from 1 to the largest value a shape takes there."""
    by: dict[tuple, dict[str, int]] = {}
    for s in shapes:
        dims = family.dims_dict(tuple(int(v) for v in s))
        key = tuple((k, v) for k, v in dims.items() if k not in family.range_dims)
        top = by.setdefault(key, {})
        for d in family.range_dims:
            if d in dims:
                top[d] = max(top.get(d, 1), int(dims[d]))
    return [{"match": dict(k), "ranges": {d: [1, v] for d, v in top.items()}}
            for k, top in by.items()]


def draw(family: Any, ranges: Sequence[dict], rng: random.Random,
         fixed: bool = True) -> list[Shape]:
    """Every shape the judgement checks across `ranges`: the stratified draw, and with `fixed`
    (a table's ranges) their fixed points as well (Family.range_shapes)."""
    out: list[Shape] = []
    for r in ranges:
        m, rg = dict(r.get("match", {})), dict(r.get("ranges", {}))
        pts = list(family.range_shapes(m, rg, rng)) if fixed else []
        for s in pts + stratified(family, m, rg, rng):
            if tuple(s) not in out:
                out.append(tuple(s))
    return out
