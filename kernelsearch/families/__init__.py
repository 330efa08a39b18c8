"""Kernel families by name. Each family package defines `FAMILY` (see base.Family) and keeps its
variants as candidate-format source files beside it, so built-in kernels go through the same
guard and harness as any submitted candidate."""
from __future__ import annotations

import importlib

from kernelsearch.families.base import Family, Variant  # noqa: F401  (re-exported)

NAMES = ("softmax", "rmsnorm", "swiglu", "matmul", "decode_attention", "rope", "mla_decode",
         "mla_sparse_decode", "mla_decode_mtp", "mla_sparse_decode_fp8")


def get(name: str) -> Family:
    if name not in NAMES:
        raise KeyError(f"unknown kernel family {name!r}; expected one of {', '.join(NAMES)}")
    return importlib.import_module(f"kernelsearch.families.{name}").FAMILY


def all_families() -> list[Family]:
    return [get(n) for n in NAMES]
