"""Shapes nobody chose, drawn fresh for every judgement (tiny ones for the CPU)."""
from __future__ import annotations

import random

from kernelsearch.families.base import Family
from kernelsearch.harness.draws import fresh_seed


def random_shapes(family: Family, n: int, big: bool = False) -> list:
    """Shapes nobody chose: odd sizes drawn fresh for every check (tiny ones for the CPU)."""
    r = random.Random(fresh_seed())
    out = []
    for _ in range(n):
        if family.name in ("softmax", "rmsnorm", "swiglu"):
            out.append((r.randint(1, 64 if big else 6), r.randint(1, 20000 if big else 2500)))
        elif family.name == "matmul":
            m = r.choice([r.randint(1, 16), r.randint(17, 700 if big else 40)])
            out.append((m, r.randint(1, 3000 if big else 70), r.randint(1, 3000 if big else 90)))
        elif family.name == "decode_attention":
            hkv = r.randint(1, 8 if big else 2)
            g = r.choice([1, 2, 4, 8])
            out.append((r.randint(1, 4 if big else 2), hkv * g, hkv,
                        r.randint(1, 20000 if big else 150), r.choice([64, 128] if big else [16, 32])))
        elif family.name in ("mla_decode", "mla_sparse_decode"):
            page = r.choice([1, 16, 64])
            L = r.randint(1, 20000 if big else 150)
            shape = (r.randint(1, 8 if big else 3), r.choice([16, 128] if big else [4, 16]), L,
                     page, 1)
            out.append(shape if family.name == "mla_decode"
                       else shape[:4] + (r.choice([64, 2048] if big else [16, 48]), 1))
        elif family.name == "rope":
            out.append((r.randint(1, 300 if big else 4), r.randint(1, 140 if big else 8),
                        2 * r.randint(1, 128 if big else 20)))
        else:  # a family named nowhere above: from what it declares, so none goes unchecked
            out.append(declared_random_shape(family, r, big))
    return out


def declared_random_shape(family: Family, r: random.Random, big: bool) -> tuple:
    """A shape drawn from the family's own declarations: every range dim anywhere from 1 to
    the largest it searches (the tiny shapes on the CPU), the exact (model) dims as one of its
    shapes has them, made valid by its `fit`."""
    shapes = list(family.search_shapes if big else family.tiny_shapes) or list(family.tiny_shapes)
    base = r.choice(shapes)
    top = {d: max(int(s[i]) for s in shapes) for i, d in enumerate(family.shape_dims)}
    shape = tuple(r.randint(1, max(1, top[d])) if d in family.range_dims else int(base[i])
                  for i, d in enumerate(family.shape_dims))
    return tuple(family.fit(shape)) if family.fit is not None else shape
