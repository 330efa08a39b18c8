"""Library variant: FlashMLA's SM90 sparse kernel (flash_mla.flash_mla_sparse_fwd) over the
family's bf16 paged cache, as vLLM runs sparse decode on a bf16 cache: the cache viewed as
[rows, 1, 576] and the indices turned into physical rows (flashmla_layouts.physical_rows, one
small gather; `prepare` does it, so a benchmark can time `run` alone and the conversion apart).
q and the cache go in dense and 16-byte aligned (flashmla_layouts.aligned: a copy only for a
view that is not; the gathered rows are a fresh tensor)."""
from kernelsearch import libraries
from kernelsearch.families import flashmla_layouts as layouts


def prepare(q, kv_cache, block_table, seq_lens, indices, scale):
    rows = layouts.physical_rows(kv_cache, block_table, seq_lens, indices)
    q, kv_cache = layouts.aligned(q), layouts.aligned(kv_cache)
    return q, kv_cache.view(-1, 1, kv_cache.shape[-1]), rows, scale


def run(q, kv_rows, rows, scale):
    fm = libraries.module("flash_mla")
    return fm.flash_mla_sparse_fwd(q, kv_rows, rows, scale, 512)[0]


def forward(q, kv_cache, block_table, seq_lens, indices, scale):
    return run(*prepare(q, kv_cache, block_table, seq_lens, indices, scale))
