"""The dispatch tables shipped with the project for a GPU: host_profiles/kernels/<gpu>*.json.

`<gpu>-graphs.json` was selected with decode under CUDA graphs (the serving case, transformers'
compiled fast path), `<gpu>.json` eagerly, `<gpu>-<what>.json` covers more families (e.g.
h200-mla.json, the DeepSeek MLA kernels). They are starting points a search may take
(`metaltune search mixed --suggest-table auto`), never installed behind the user's back."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

SHIPPED = Path(__file__).resolve().parents[1] / "host_profiles" / "kernels"


def gpu_slug(name: str) -> str:
    """'NVIDIA H200' -> 'h200' (the shipped tables' file names)."""
    words = [w for w in name.lower().replace("-", " ").split() if w not in ("nvidia", "geforce")]
    return "".join(words[:1]) or name.lower()


def device_name() -> Optional[str]:
    """This process's GPU, or None without one (torch imported only here)."""
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else None


def shipped_tables(name: Optional[str] = None) -> list[Path]:
    """Every shipped table for GPU `name` (None: this process's GPU; no GPU: none), in the order
    a lookup should prefer them: -graphs, the plain one, then the others by name."""
    name = device_name() if name is None else name
    if not name:
        return []
    slug = gpu_slug(name)
    first = [SHIPPED / f"{slug}-graphs.json", SHIPPED / f"{slug}.json"]
    rest = sorted(p for p in SHIPPED.glob(f"{slug}-*.json") if p not in first)
    return [p for p in first if p.is_file()] + rest


def shipped_table(name: Optional[str] = None) -> Optional[Path]:
    """The table to install when the user names none: -graphs, else the plain one, else None."""
    name = device_name() if name is None else name
    if not name:
        return None
    main = (f"{gpu_slug(name)}-graphs.json", f"{gpu_slug(name)}.json")
    return next((p for p in shipped_tables(name) if p.name in main), None)
