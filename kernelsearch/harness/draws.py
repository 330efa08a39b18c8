"""What each correctness check draws, cycled so every kind comes up within a few checks:
value distribution, scalar values, memory layouts (where dispatch would still run the kernel:
`dispatch_runs`), the position of a ragged batch's longest sequence, grad mode and poison."""
from __future__ import annotations

import os
import random
from typing import Any

import torch

from kernelsearch.families.base import DISTRIBUTIONS, LAYOUTS, Family, dtype_of, relayout

GRAD_MODES = ("grad", "no_grad", "inference")
POISONS = ("nan", "large", "zero")


def poison_value(kind: str, dtype: str) -> float:
    """What the judge fills a candidate's allocations with: NaN, a large finite value of the
    dtype, or zeros (a kernel that only checks for NaN in its output buffer meets the others)."""
    if kind == "nan":
        return float("nan")
    if kind == "zero":
        return 0.0
    return float(torch.finfo(dtype_of(dtype)).max) / 4


def _cycle(items, rng: random.Random):
    """Every item once per round, in one random order: cycles of coprime lengths (4
    distributions, 3 grad modes, 5 layouts, 3 or 5 scalar values) meet in every combination."""
    xs = list(items)
    rng.shuffle(xs)
    while True:
        yield from xs


LONGEST = ("first", "last", "middle")


def _cycle_fixed(xs: list):
    while True:
        yield from xs


def dispatch_runs(family: Family, args) -> bool:
    """Whether `dispatch.call` would hand these arguments to a table kernel (else torch runs
    them, and the judge need not): the family takes their shape and layout, on one device."""
    try:
        family.shape_of(*args)
    except (AttributeError, IndexError, TypeError, ValueError):
        return False
    if family.layout_of is not None and family.layout_of(*args) != family.layout:
        return False
    # what dispatch._usable requires (not imported: dispatch imports the harness; a test
    # checks that the two agree)
    ts = [a for a in args if isinstance(a, torch.Tensor)]
    if not ts or any(t.device != ts[0].device for t in ts):
        return False
    if ts[0].device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        return False
    return family.name != "decode_attention" or all(t.stride(-1) == 1 for t in ts)


class Draws:
    """The judge's choices for each check, cycled so every kind comes up within a few checks:
    value distribution, scalar values, memory layouts, grad mode, poison."""

    def __init__(self, family: Family, rng: random.Random):
        self.family, self.rng = family, rng
        self.dist = _cycle(DISTRIBUTIONS, rng)
        # boundary shapes check which elements are read and written: values under which every
        # one shows (uniform_wide turns attention one-hot, and a dropped token can hide)
        self.edge_dist = _cycle(("normal", "small"), rng)
        self.grad = _cycle(GRAD_MODES, rng)
        self.poison = _cycle(POISONS, rng)
        self.scalars = {i: sc.cycle(rng) for i, sc in family.scalars.items()}
        self.layouts: dict[int, Any] = {}
        order = list(LONGEST)
        k = rng.randrange(len(order))
        self.longest = _cycle_fixed(order[k:] + order[:k])

    def batch_order(self, args: tuple) -> tuple:
        """The longest sequence of a ragged batch moved to the next position of a rotation
        (first, last, middle): no two checks in a row have it first."""
        f = self.family
        if f.lengths_arg is None:
            return args
        lens = args[f.lengths_arg]
        B = int(lens.shape[0])
        where = next(self.longest)
        if B < 2:
            return args
        cur = int(lens.argmax())
        to = {"first": 0, "last": B - 1, "middle": max(1, B // 2)}[where]
        perm = list(range(B))
        perm[cur], perm[to] = perm[to], perm[cur]
        idx = torch.tensor(perm, device=lens.device)
        return tuple(a.index_select(0, idx) if i in f.batch_args else a
                     for i, a in enumerate(args))

    def scalars_into(self, args: tuple) -> tuple:
        args = list(args)
        for i, it in self.scalars.items():
            if i < len(args):
                args[i] = next(it)
        return tuple(args)

    def views_of(self, args: tuple) -> tuple[tuple, list[str]]:
        """Each tensor argument re-laid in the next layout of its own cycle, kept where
        dispatch would still run the kernel on it (else that argument stays contiguous)."""
        args = list(args)
        if not dispatch_runs(self.family, args):
            return tuple(args), []
        kinds = []
        for i, a in enumerate(args):
            if not isinstance(a, torch.Tensor):
                continue
            kind = next(self.layouts.setdefault(i, _cycle(LAYOUTS, self.rng)))
            if kind == "contiguous":
                continue
            trial = list(args)
            trial[i] = relayout(a, kind)
            if dispatch_runs(self.family, trial):
                args = trial
                kinds.append(f"arg{i}:{kind}")
        return tuple(args), kinds


def copy_into(args, new) -> None:
    """New values into the same tensors (a function: no loop variable keeps `new` alive)."""
    for a, f in zip(args, new):
        if isinstance(a, torch.Tensor):
            a.copy_(f)


def fresh_seed() -> int:
    return int.from_bytes(os.urandom(4), "little")
