"""Gluon variants: candidate-format sources whose kernels are `@gluon.jit` (explicit layouts,
warpgroup MMA, async copies, mbarriers). They go through the same guard (its Gluon rules), judge
and tables as Triton variants, but Gluon has no interpreter path and its Hopper instructions
need an sm_90 GPU: such a variant is `gpu_only` and offered (`Variant.valid`, so the family's
space, the search, the judge and the tables see it) only where `available()` holds. The files
are written against Triton 3.6's Gluon names (the H200's Triton); a Triton without them (3.9
renamed two) does not offer them either."""
from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Callable

from kernelsearch.families.base import Shape, Variant

# Gluon names the shipped files use (3.9 has no thread_barrier, and its
# async_copy_global_to_shared is a stub that raises "removed; call async_load")
NAMES = {"triton.experimental.gluon.language": ("thread_barrier", "allocate_shared_memory"),
         "triton.experimental.gluon.language.nvidia.ampere.async_copy":
             ("async_copy_global_to_shared", "commit_group", "wait_group"),
         "triton.experimental.gluon.language.nvidia.hopper":
             ("warpgroup_mma", "warpgroup_mma_wait", "fence_async_shared")}


@functools.lru_cache(maxsize=None)
def _names_missing() -> tuple[str, ...]:
    import importlib

    missing = []
    for mod, names in NAMES.items():
        try:
            m = importlib.import_module(mod)
        except Exception:  # noqa: BLE001 - any import failure means: not offered
            missing.append(mod)
            continue
        missing += [f"{mod}.{n}" for n in names if not hasattr(m, n)]
    return tuple(missing)


@functools.lru_cache(maxsize=None)
def _gpu() -> str:
    """'' when device 0 is an sm_90 GPU, else why not."""
    try:
        import torch

        if not torch.cuda.is_available():
            return "no CUDA GPU"
        cap = torch.cuda.get_device_capability()
    except Exception as e:  # noqa: BLE001
        return f"no CUDA GPU ({type(e).__name__})"
    return "" if cap[0] == 9 else f"GPU is sm_{cap[0]}{cap[1]}, not sm_90"


def why_not() -> str:
    """'' where Gluon variants are offered, else the reason (what `metaltune kernel families`
    prints). TRITON_INTERPRET is read on every call (tests and the judge's children set it)."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return "TRITON_INTERPRET=1 (Gluon has no interpreter path)"
    gpu = _gpu()
    if gpu:
        return gpu
    missing = _names_missing()
    return f"this Triton lacks {', '.join(missing)}" if missing else ""


def why_not_on(device: str) -> str:
    """'' where a Gluon candidate can be judged on `device` ("cpu": Triton's interpreter, or
    "cuda"), else why not: the device part of `why_not` (a candidate may use Gluon names the
    shipped files do not, so this Triton's names are left to its compiler)."""
    if device != "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        return "Gluon has no interpreter path" + ("" if device == "cuda" else
                                                  f" (device {device})")
    return _gpu()


def available() -> bool:
    return not why_not()


def variant(name: str, here: Path, dims: dict[str, list],
            valid: Callable[[dict, Shape], bool]) -> Variant:
    """A Gluon variant `name` (module here/name.py): `valid` is its tile rule; the variant is
    offered only where `available()`."""
    def offered(cfg: dict, shape: Shape) -> bool:
        return valid(cfg, shape) and available()

    return Variant(name, here / f"{name}.py", dims, offered, gpu_only=True, tile_valid=valid)
