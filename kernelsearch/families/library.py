"""Library variants: a family's choice that wraps an installed library kernel (FlashMLA,
flash-attn) instead of a Triton source. Each is a shipped module beside the family's Triton
variants (`forward` with the family's signature, the layout conversions inside it), declared
with the library it needs, the shapes it fits and its dtypes. It is offered (`Variant.valid`,
so the family's space, the search and the table see it) only where `kernelsearch.libraries`
found the library; the judge runs it like any variant (correctness at scale, poisoned
allocations, graph replays, timing) without the static guard, whose rules are for Triton
source, and the verdict says `kind: library`.

The yardstick of every verdict and table is the best library kernel a shape is offered
(`best`: the family's declaration order, fastest first as measured on the H200); dispatch falls
back to it outside a table's ranges, then to torch (`kernelsearch.table.FALLBACK`)."""
from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

from kernelsearch import libraries
from kernelsearch.families.base import Family, Shape, Variant


def variant(name: str, here: Path, library: str, fits: Callable[[Shape], bool],
            dtypes: Iterable[str], fit: Optional[Callable[[Shape], Shape]] = None) -> Variant:
    """A library variant `name` (module here/name.py) over `library`; no parameters. `fits`:
    the shapes it takes; `fit`: the nearest such shape (for the judge's boundary shapes)."""
    if library not in libraries.LIBRARIES:
        raise KeyError(f"unknown library {library!r}; expected one of "
                       f"{', '.join(libraries.LIBRARIES)}")

    def valid(cfg: dict, shape: Shape) -> bool:
        return not cfg and libraries.available(library) and bool(fits(tuple(shape)))

    return Variant(name, here / f"{name}.py", {}, valid, kind="library", library=library,
                   dtypes=tuple(dtypes), fit=fit)


def is_library(fam: Family, name: str) -> bool:
    v = fam.variants.get(name)
    return v is not None and v.kind == "library"


def of(fam: Family) -> list[Variant]:
    """The family's library variants, in its order of preference."""
    return [v for v in fam.variants.values() if v.kind == "library"]


def offered(fam: Family, shape: Shape, dtype: Optional[str] = None) -> list[str]:
    """The library variants this host offers at `shape` (and `dtype`), best first."""
    return [v.name for v in of(fam) if (dtype is None or not v.dtypes or dtype in v.dtypes)
            and v.valid({}, tuple(shape))]


def best(fam: Family, shape: Shape, dtype: Optional[str] = None) -> Optional[str]:
    got = offered(fam, shape, dtype)
    return got[0] if got else None


def shipped(family: Family, source: str) -> Optional[Variant]:
    """The library variant whose shipped file is exactly `source` (a judge asked to treat a
    source as a library one checks this: nobody else's code skips the guard)."""
    for v in of(family):
        try:
            if v.file.read_text() == source:
                return v
        except OSError:
            continue
    return None


def forward(family: str, name: str) -> Callable[..., Any]:
    return importlib.import_module(f"kernelsearch.families.{family}.{name}").forward


def report(fam: Family) -> list[dict]:
    """Per library variant: its library, whether it is found here, its version or why not."""
    out = []
    for v in of(fam):
        f = libraries.discover(v.library)
        out.append({"variant": v.name, "library": v.library, "status": f.status,
                    "version": f.version, "reason": f.reason, "dtypes": list(v.dtypes)})
    return out
