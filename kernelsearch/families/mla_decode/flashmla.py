"""Library variant: FlashMLA's SM90 dense decode (flash_mla.flash_mla_with_kvcache) over the
family's paged latent cache. The block-table layout is FlashMLA's own (views only); the tile
scheduler metadata is made inside every call (get_mla_metadata is filled on first use, and may
be reused only while the lengths stay the same, which no decode step guarantees): one small
extra kernel, included in every time this variant reports."""
from kernelsearch import libraries
from kernelsearch.families import flashmla_layouts as layouts


def prepare(q, kv_cache, block_table, seq_lens, scale):
    return layouts.dense(q, kv_cache, block_table, seq_lens) + (scale,)


def run(q4, kv4, block_table, seq_lens, scale):
    fm = libraries.module("flash_mla")
    meta = fm.get_mla_metadata()[0]
    out = fm.flash_mla_with_kvcache(q4, kv4, block_table, seq_lens, 512, meta, None,
                                    softmax_scale=scale, causal=False)[0]
    return out.view(q4.shape[0], q4.shape[2], 512)


def forward(q, kv_cache, block_table, seq_lens, scale):
    return run(*prepare(q, kv_cache, block_table, seq_lens, scale))
