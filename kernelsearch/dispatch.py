"""Runtime dispatch for model code:

    from kernelsearch import dispatch
    dispatch.install(table)                 # DispatchTable, its dict form, a path; None clears
    y = dispatch.call("rmsnorm", x, weight, eps)   # or dispatch.rmsnorm(x, weight, eps)

A call whose (family, dtype, shape) falls inside a validated range of the installed table runs
that kernel; anything else (no table, another shape, a CPU tensor, an odd layout) runs the plain
torch op. Tables are measured on each family's input layout (matmul: b = W.t(), as F.linear),
so a call with another layout (a row-major [K, N] b) runs torch too: a kernel judged and timed on
one layout can be several times slower on another. Lookups are cached per argument dtypes,
shapes, strides and devices, so the steady-state cost is one dict lookup."""
from __future__ import annotations

import functools
import importlib
import os
from pathlib import Path
from typing import Any, Callable, Optional, Union

from kernelsearch.table import DispatchTable

_table: Optional[DispatchTable] = None
_cache: dict[tuple, Optional[Callable]] = {}
_stats: dict[str, int] = {"kernel": 0, "fallback": 0}


def install(table: Union[None, DispatchTable, dict, str, Path]) -> Optional[DispatchTable]:
    """Install a dispatch table (None clears it). Returns the installed table."""
    global _table
    if table is None:
        _table = None
    elif isinstance(table, DispatchTable):
        _table = table
    elif isinstance(table, dict):
        _table = DispatchTable.from_dict(table.get("kernels", table) if "entries" not in table
                                         else table)
    else:
        _table = DispatchTable.load(table)
    _cache.clear()
    return _table


def installed() -> Optional[DispatchTable]:
    return _table


def stats() -> dict[str, int]:
    """How many calls ran a table kernel and how many fell back to torch, since the process
    started (callers take differences)."""
    return dict(_stats)


def _usable(family: str, args) -> bool:
    """Kernels run on CUDA tensors (or anywhere under the Triton interpreter), all on one device;
    decode attention also needs unit stride along the head dim (the others handle any layout)."""
    import torch

    ts = [a for a in args if isinstance(a, torch.Tensor)]
    if not ts:
        return False
    dev = ts[0].device
    if dev.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        return False
    if any(t.device != dev for t in ts):
        return False
    return family != "decode_attention" or all(t.stride(-1) == 1 for t in ts)


@functools.lru_cache(maxsize=None)
def _forward(family: str, variant: str) -> Callable:
    return importlib.import_module(f"kernelsearch.families.{family}.{variant}").forward


def _key(family: str, args) -> tuple:
    """What a lookup depends on: each tensor argument's dtype, shape, strides and device (the
    table, the layout and _usable are functions of these). Cheaper than working out the
    family's shape and layout, which only a cache miss does."""
    import torch

    return (family,) + tuple((a.dtype, a.shape, a.stride(), a.get_device())
                             if isinstance(a, torch.Tensor) else None for a in args)


def _resolve(family: str, args) -> Optional[Callable]:
    key = _key(family, args)
    try:
        return _cache[key]
    except KeyError:
        pass
    fn = _lookup(family, args)
    _cache[key] = fn
    return fn


def _lookup(family: str, args) -> Optional[Callable]:
    from kernelsearch.families import get
    from kernelsearch.families.base import dtype_name

    fam = get(family)
    try:
        shape = tuple(int(v) for v in fam.shape_of(*args))
        dtype = dtype_name(args[0].dtype)
    except (AttributeError, IndexError, TypeError, ValueError):
        return None  # not a shape this family's kernels take: torch handles it
    if family == "matmul" and (args[0].dim() != 2 or args[1].dim() != 2):
        return None
    layout = fam.layout_of(*args) if fam.layout_of is not None else ""
    if _table is None or layout != fam.layout or not _usable(family, args):
        return None
    e = _table.lookup(family, dtype, fam.dims_dict(shape))
    return None if e is None else functools.partial(_forward(family, e.variant), **e.config)


def call(family: str, *args: Any) -> Any:
    fn = _resolve(family, args) if _table is not None else None
    if fn is None:
        _stats["fallback"] += 1
        from kernelsearch.families import get

        return get(family).torch_default(*args)
    _stats["kernel"] += 1
    from kernelsearch.runtime import ensure_scratch_allocator

    ensure_scratch_allocator()  # device-built TMA descriptors need triton scratch memory
    return fn(*args)


def softmax(x):
    return call("softmax", x)


def rmsnorm(x, weight, eps: float = 1e-6):
    return call("rmsnorm", x, weight, eps)


def swiglu(gate, up):
    return call("swiglu", gate, up)


def matmul(a, b):
    return call("matmul", a, b)


def decode_attention(q, k, v):
    return call("decode_attention", q, k, v)


def rope(x, cos, sin):
    return call("rope", x, cos, sin)


def mla_decode(q, kv_cache, block_table, seq_lens, scale: float):
    """Absorbed MLA decode over a paged latent cache (kernelsearch.families.mla_decode)."""
    return call("mla_decode", q, kv_cache, block_table, seq_lens, scale)


def mla_sparse_decode(q, kv_cache, block_table, seq_lens, indices, scale: float):
    """Sparse MLA decode over the top-k `indices` (kernelsearch.families.mla_sparse_decode)."""
    return call("mla_sparse_decode", q, kv_cache, block_table, seq_lens, indices, scale)


def resolve(family: str, *args: Any) -> Optional[Callable]:
    """The kernel `call` would run for these arguments (the variant's forward with its config
    bound, a functools.partial), or None where it would run torch; runs nothing and counts
    nothing. For callers that hand a kernel more than the family signature (the static-cache
    attention op passes filled lengths): they `count` what they ran."""
    return _resolve(family, args) if _table is not None else None


def count(kind: str) -> None:
    """Record one call that a `resolve` caller ran ("kernel") or handed to torch ("fallback")."""
    _stats[kind] += 1
