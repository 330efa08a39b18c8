"""Library variant: FlashMLA's SM90 sparse kernel at fewer heads than its 64-head tile (tensor
parallel 8 and 4: 16 and 32 heads a GPU), as vLLM runs it there: q padded with zero heads to
64 (a fresh tensor, in `prepare`), the output's first H heads kept (one small copy, in `run`).
Everything else is flashmla_sparse's: physical rows, dense aligned inputs."""
from kernelsearch.families.mla_sparse_decode import flashmla_sparse as _sparse

PAD_HEADS = 64  # FlashMLA's sparse tile: it takes 64 or 128 heads


def prepare(q, kv_cache, block_table, seq_lens, indices, scale):
    import torch

    B, H, D = q.shape
    padded = torch.zeros((B, PAD_HEADS, D), dtype=q.dtype, device=q.device)
    padded[:, :H] = q
    return _sparse.prepare(padded, kv_cache, block_table, seq_lens, indices, scale) + (H,)


def run(q, kv_rows, rows, scale, heads):
    return _sparse.run(q, kv_rows, rows, scale)[:, :heads].contiguous()


def forward(q, kv_cache, block_table, seq_lens, indices, scale):
    return run(*prepare(q, kv_cache, block_table, seq_lens, indices, scale))
