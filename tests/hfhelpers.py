"""Tiny transformers models and a dispatch table whose entries cover their shapes, so the Triton
kernels really run under the CPU interpreter (float32: the interpreter's dot is exact there)."""
from __future__ import annotations

from typing import Any

from kernelsearch.table import DispatchTable, Entry

# one config a family's variant takes at these tiny sizes (validity is checked against the
# family's own constraints below)
CONFIGS = {
    "rmsnorm": ("row", {"ROWS": 1, "num_warps": 1}),
    "swiglu": ("flat", {"BLOCK": 128, "num_warps": 1}),
    "rope": ("heads", {"BLOCK_H": 1, "num_warps": 1}),
    # SPLIT 128 with caches past 128 positions: several chunks, the later ones empty early on
    "decode_attention": ("flashdec", {"BLOCK_N": 32, "SPLIT": 128, "STAGES": 2, "num_warps": 4}),
}


def covering_table(config: Any, dtype: str = "float32", max_rows: int = 4096,
                   max_len: int = 4096, max_batch: int = 8) -> DispatchTable:
    """Entries at the model's exact dims over wide ranges of rows, batch and length. Built as
    Entry objects: DispatchTable.from_dict would refuse float32 decode attention, which the GPU
    tables never hold (tf32 dots), while the interpreter computes it exactly."""
    from kernelsearch.families import get

    c = config
    hd = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    hq, hkv = c.num_attention_heads, c.num_key_value_heads
    ents = []
    for cols in sorted({c.hidden_size, hd}):
        ents.append(Entry("rmsnorm", dtype, {"cols": cols}, {"rows": [1, max_rows]},
                          *CONFIGS["rmsnorm"]))
    ents.append(Entry("swiglu", dtype, {"cols": c.intermediate_size}, {"rows": [1, max_rows]},
                      *CONFIGS["swiglu"]))
    ents.append(Entry("rope", dtype, {"NH": hq + hkv, "D": hd}, {"B": [1, max_batch]},
                      *CONFIGS["rope"]))
    ents.append(Entry("decode_attention", dtype, {"HQ": hq, "HKV": hkv, "D": hd},
                      {"B": [1, max_batch], "L": [1, max_len]}, *CONFIGS["decode_attention"]))
    for e in ents:
        fam = get(e.family)
        dims = dict(e.match, **{k: v[1] for k, v in e.ranges.items()})
        assert fam.variants[e.variant].valid(e.config, tuple(dims[k] for k in fam.shape_dims)), e
    return DispatchTable(ents, device="cpu-interpreter")
