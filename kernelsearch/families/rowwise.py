"""Shared pieces of the row-wise memory-bound families (softmax, rmsnorm, swiglu): shapes are
(rows, cols) with the reduction or the model dim on cols."""
from __future__ import annotations

from kernelsearch.families.base import pow2_at_least

# shapes the facts were measured on, plus Llama decode/prefill sizes (d 4096, ffn 14336)
SWEEP = [(8, 4096), (8, 8192), (256, 4096), (4096, 4096), (16384, 8192), (65536, 8192),
         (32768, 18992)]
HELDOUT = [(37, 8191), (1000, 5000), (3, 18992), (513, 4097), (1, 14336)]
TINY = [(3, 17), (8, 64), (5, 300), (1, 1000)]
# Boundary coverage (Family.boundary_shapes): ROWS per program and grids of one program per row
# (or ROWS rows) cross the powers of two in rows; BLOCK/chunk widths up to 8192 and whole-row
# blocks (next power of two of cols) cross them in cols. 3 rows / 17 columns keep the rest cheap;
# the interpreter runs one program at a time (and a chunked loop one chunk at a time), so past
# 257 rows and 8193 columns only the GPU checks.
EDGES = {"rows": (64, 256, 4096, 65536), "cols": (1024, 2048, 4096, 8192, 16384, 32768)}
CHEAP = (3, 17)
INTERP_MAX = {"rows": 257, "cols": 8193}


def row_valid(cfg: dict, shape) -> bool:
    """Whole row(s) in registers: at most 64 fp32 values per thread, and no warps left idle."""
    block = pow2_at_least(shape[1])
    per_thread = cfg["ROWS"] * block / (32 * cfg["num_warps"])
    if per_thread > 64:
        return False
    if cfg["ROWS"] > 1 and cfg["ROWS"] > pow2_at_least(shape[0]):
        return False
    return per_thread >= 1 or cfg["num_warps"] == 1


def looped_valid(cfg: dict, shape) -> bool:
    """Chunked loop over the row: the chunk must not exceed the row, or 16 values per thread."""
    if cfg["BLOCK"] > max(pow2_at_least(shape[1]) // 2, 128):
        return False
    return cfg["BLOCK"] / (32 * cfg["num_warps"]) <= 16


def split_valid(cfg: dict, shape) -> bool:
    """A row held as two power-of-two pieces: for lengths that are not a power of two (the row
    variant covers those), at most 64 fp32 values per thread."""
    n = shape[1]
    if n & (n - 1) == 0:
        return False
    a = pow2_at_least(n) // 2
    lanes = a + pow2_at_least(max(1, n - a))
    return lanes / (32 * cfg["num_warps"]) <= 64
