"""What the dispatch table chooses inside a CUDA graph the engine captures.

A captured graph replays the kernel launches recorded at capture: no Python runs at replay, so a
per-call choice (dispatch's lookup by shape) cannot follow the context length from step to step.
vLLM captures one graph per batch size in `compilation_config.cudagraph_capture_sizes`, with
inputs padded to that size, and its paged caches have a fixed capacity (the block table's
columns times the page size, which `max_model_len` bounds). So the shape every op sees in a
graph is fixed at capture: rows = the captured batch size for the row-wise families, and for
the attention families B = the batch size and L = the cache capacity, whatever the sequences'
lengths at replay (the kernels read those from device memory, `seq_lens`).

The rule, the same lookup dispatch does at capture time: for each captured batch size B the
entry covering (B, max context) is pinned for that graph; where no entry covers both, the graph
runs the library kernel offered at that shape, else torch. A kernel is never pinned for a graph
whose capacity lies outside its certified range, because every replay up to that capacity
would run it. The first call at each shape resolves and compiles the kernel; vLLM's warm-up runs
every capture size before capturing, so nothing compiles during capture, and the canary is not
replayed during capture or at replay (kernelsearch.canary)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Optional

#: per family: the dim a captured batch size sets, and the one the cache capacity sets
BATCH_DIM = {"rmsnorm": "rows", "swiglu": "rows", "softmax": "rows", "matmul": "M",
             "rope": "B", "decode_attention": "B", "mla_decode": "B",
             "mla_sparse_decode": "B", "mla_decode_mtp": "B", "mla_sparse_decode_fp8": "B"}
CONTEXT_DIM = {"decode_attention": "L", "mla_decode": "L", "mla_sparse_decode": "L",
               "mla_decode_mtp": "L", "mla_sparse_decode_fp8": "L"}


@dataclass(frozen=True)
class GraphChoice:
    """What one captured graph runs for a family: `how` is "table", "library" or "torch"."""

    batch: int
    how: str
    variant: Optional[str]
    config: dict
    dims: dict

    def to_dict(self) -> dict[str, Any]:
        return {"batch": self.batch, "how": self.how, "variant": self.variant,
                "config": dict(self.config), "dims": dict(self.dims)}


def graph_dims(family: str, match: dict[str, int], batch: int,
               max_context: Optional[int] = None) -> dict[str, int]:
    """The shape an op of `family` has inside the graph captured at `batch`: the exact dims
    (`match`: hidden size, heads, page) with the batch dim set to the captured size and, for
    the attention families, the context dim to the cache capacity."""
    if family not in BATCH_DIM:
        raise ValueError(f"family {family!r}: no batch dim known for a captured graph "
                         f"(known: {', '.join(sorted(BATCH_DIM))})")
    if batch < 1:
        raise ValueError(f"captured batch size {batch}: expected >= 1")
    dims = dict(match)
    dims[BATCH_DIM[family]] = int(batch)
    if family in CONTEXT_DIM:
        if max_context is None or max_context < 1:
            raise ValueError(f"family {family!r} keys on the context: pass the cache capacity "
                             f"(max_model_len), got {max_context!r}")
        dims[CONTEXT_DIM[family]] = int(max_context)
    return dims


def capture_plan(table: Any, family: str, dtype: str, match: dict[str, int],
                 capture_sizes: Iterable[int], max_context: Optional[int] = None
                 ) -> list[GraphChoice]:
    """For each captured batch size (ascending, each once), what the graph pins: the table
    entry covering (batch, max_context), else the library kernel offered there, else torch
    (DispatchTable.choose, the lookup dispatch runs at capture)."""
    out = []
    for b in sorted({int(b) for b in capture_sizes}):
        dims = graph_dims(family, match, b, max_context)
        how, entry, variant = table.choose(family, dtype, dims)
        out.append(GraphChoice(b, how, variant, dict(entry.config) if entry is not None else {},
                               dims))
    return out


def summary(plan: list[GraphChoice]) -> str:
    """One log line: the captured batch sizes grouped by what they pin, e.g.
    "1-64: row {num_warps: 4}; 65-512: looped {...}; 1024: torch"."""
    groups: list[list] = []
    for c in plan:
        what = c.variant if c.how != "torch" else "torch"
        what += f" {c.config}" if c.config else ""
        what += " (library)" if c.how == "library" else ""
        if groups and groups[-1][2] == what:
            groups[-1][1] = c.batch
        else:
            groups.append([c.batch, c.batch, what])
    return "; ".join((f"{a}" if a == b else f"{a}-{b}") + f": {w}" for a, b, w in groups)
