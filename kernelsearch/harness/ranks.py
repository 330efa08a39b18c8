"""Every input rank a family takes, checked by the judge.

A family declares what it takes through `shape_of` (and dispatch hands a table kernel any
arguments `shape_of` accepts): the row-wise families (softmax, rmsnorm, swiglu) take `x` of any
rank, rows being every dim but the last, and a model calls them with [batch, seq, hidden] (and
[hidden] for a single row). The judge's inputs (`make_inputs`) are [rows, cols] only, so a
candidate that unpacks `n_rows, n_cols = x.shape` would pass and then raise in the model.

So after all its checks at the rank `make_inputs` gives (unchanged, so every rule fires where
it did), the judge runs one more check per dtype for each other rank the family takes
(`after`, `inputs`): the first argument, and every tensor argument of its shape (swiglu's gate
and up), re-ranked (`reshape`: leading dims split or merged, the last dim kept), kept only where
the family takes it for the same problem (`dispatch_runs` holds, `shape_of` gives the same
shape). A family that takes one rank only (rope, MLA, matmul, decode attention) gets none."""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch

RANKS = (1, 2, 3, 4)
_ERRORS = (AttributeError, IndexError, TypeError, ValueError, RuntimeError)


def _smallest_factor(n: int) -> int:
    f = 2
    while f * f <= n:
        if n % f == 0:
            return f
        f += 1
    return n


def shapes(shape: tuple[int, ...]) -> dict[int, tuple[int, ...]]:
    """rank -> the same values in that rank (leading dims split or merged; last dim kept)."""
    *lead, last = shape
    rows = 1
    for d in lead:
        rows *= d
    a = _smallest_factor(rows) if rows > 1 else 1
    out = {2: (rows, last), 3: (a, rows // a, last), 4: (1, a, rows // a, last),
           len(shape): tuple(shape)}
    if rows == 1:
        out[1] = (last,)
    return out


def _reranked(args: list, rank: int) -> Optional[list]:
    base = tuple(args[0].shape)
    want = shapes(base).get(rank)
    if want is None:
        return None
    return [a.reshape(want) if isinstance(a, torch.Tensor) and tuple(a.shape) == base else a
            for a in args]


def reshape(family: Any, args: tuple, rank: Optional[int],
            runs: Callable[[Any, list], bool]) -> tuple[list, list[str]]:
    """(the arguments in `rank`, [a note naming it]) where the family takes them so for the
    same problem; else as they are. `runs`: draws.dispatch_runs (correctness imports us)."""
    args = list(args)
    if rank is None or not args or not isinstance(args[0], torch.Tensor) \
            or args[0].dim() in (0, rank):
        return args, []
    trial = _reranked(args, rank)
    try:
        ok = trial is not None and runs(family, trial) and \
            family.shape_of(*trial) == family.shape_of(*args)
    except _ERRORS:
        ok = False
    return (trial, [f"rank {rank} {tuple(trial[0].shape)}"]) if ok and trial else (args, [])


def taken(family: Any) -> set[int]:
    """The ranks of its first argument the family takes, beside the one make_inputs gives
    (tried on small CPU inputs: shape_of alone, no kernel runs)."""
    shape = tuple(family.cheap or family.tiny_shapes[0])
    try:
        args = list(family.make_inputs(shape, family.dtypes[0], "cpu",
                                       torch.Generator().manual_seed(0)))
    except _ERRORS:
        return set()
    if not args or not isinstance(args[0], torch.Tensor) or args[0].dim() == 0:
        return set()
    one = [a[:1] if isinstance(a, torch.Tensor) and a.shape == args[0].shape else a
           for a in args]  # a single row, for rank 1
    out = set()
    for rank in RANKS:
        src = one if rank == 1 else args
        trial = _reranked(src, rank) if rank != args[0].dim() else None
        try:
            if trial is not None and family.shape_of(*trial) == family.shape_of(*src):
                out.add(rank)
        except _ERRORS:
            continue
    return out


def after(family: Any, shapes_: list, boundary: Optional[list]) -> list[tuple]:
    """The judge's single-call checks after its main loop: (shape, None) for each boundary
    shape, then (shape, rank) for each other rank the family takes, at the first checked shape
    (its leading dims set to 1 for rank 1: a single row)."""
    out: list[tuple] = [(tuple(s), None) for s in boundary or []]
    if shapes_:
        first = tuple(shapes_[0])
        out += [(tuple(1 for _ in first[:-1]) + first[-1:] if r == 1 else first, r)
                for r in sorted(taken(family))]
    return out


def inputs(family: Any, draws: Any, shape: tuple, dtype: str, device: str, seed: int,
           dist: str, rank: Optional[int], runs: Callable[[Any, list], bool]) -> tuple[tuple, str]:
    """One check's arguments (the judge's draws of scalars and batch order) in `rank`, and
    what the check is called in its verdict ("boundary shape", "rank 3 (3, 1, 17) of shape");
    `runs`: draws.dispatch_runs."""
    args = draws.batch_order(draws.scalars_into(family.make_inputs(
        tuple(shape), dtype, device, torch.Generator().manual_seed(seed), dist)))
    if rank is None:
        return args, "boundary shape"
    args, note = reshape(family, args, rank, runs)
    return tuple(args), f"{note[0]} of shape" if note else "shape"
