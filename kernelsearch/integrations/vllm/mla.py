"""DeepSeek MLA decode on metaltune's `mla_decode` kernels, as a vLLM attention backend.

vLLM lets a third party register an attention backend under `AttentionBackendEnum.CUSTOM`
(`vllm.v1.attention.backends.registry.register_backend`); a user selects it with
`--attention-backend CUSTOM`. The plugin registers this module's `MetaltuneMLABackend` there
by class path (layers.register_mla): vLLM imports this module only when a user picks it. It is vLLM's Triton MLA backend (the
same metadata builder, KV-cache layout and CUDA-graph support, UNIFORM_BATCH) whose decode step
(`forward_mqa`) calls `torch.ops.metaltune.mla_decode` where the family computes it: one query
token per request, bf16 queries and latent cache of 576 = 512 + 64 columns, no decode context
parallelism (vLLM needs the LSE only to merge DCP shards). Everything else (prefill, FP8 cache,
MTP's several tokens, DCP) is vLLM's own Triton path.

vLLM's layout is the family's: q [B, H, 576] (the nope and rope parts concatenated), the paged
latent cache [blocks, page, 576], block table [B, max_blocks] int32, seq_lens [B] int32, and the
output is the latent [B, H, 512] the layer then projects. On the CPU build there is no MLA
serving path to run it in (vLLM's CPU MLA backend is another class, and vLLM's CUDA wheel cannot
run here); `decode` is tested on the CPU against the family's float64 reference and the backend's
registration against the real vLLM, the serving path is on paper (docs/vllm-plugin.md)."""
from __future__ import annotations

from typing import Any

import torch
from vllm.v1.attention.backends.mla.triton_mla import TritonMLABackend, TritonMLAImpl

import kernelsearch.ops  # noqa: F401  (torch.ops.metaltune.*)

BACKEND = "CUSTOM"  # the AttentionBackendEnum member it is registered as (layers.register_mla)
LATENT, ROPE = 512, 64


def applies(q: Any, kv_cache: Any, block_table: Any, seq_lens: Any, kv_cache_dtype: str,
            dcp_world_size: int) -> bool:
    """Whether metaltune's mla_decode computes this decode step (else vLLM's own path)."""
    return (dcp_world_size == 1 and kv_cache_dtype in ("auto", "bfloat16")
            and q.dim() == 3 and q.shape[-1] == LATENT + ROPE and kv_cache.dim() == 3
            and kv_cache.shape[-1] == LATENT + ROPE and q.dtype == kv_cache.dtype
            and q.dtype == torch.bfloat16 and q.shape[0] == seq_lens.shape[0]
            and block_table.dtype == torch.int32 and seq_lens.dtype == torch.int32)


def decode(q: Any, kv_cache: Any, block_table: Any, seq_lens: Any, scale: float) -> Any:
    """The decode step through metaltune's op: [B, H, 512]."""
    return torch.ops.metaltune.mla_decode(q, kv_cache, block_table, seq_lens, float(scale))


class MetaltuneMLAImpl(TritonMLAImpl):
    """vLLM's Triton MLA implementation with the decode step on metaltune's op where it
    applies."""

    def forward_mqa(self, q: Any, kv_c_and_k_pe_cache: Any, attn_metadata: Any,
                    layer: Any) -> tuple[Any, Any]:
        if type(q) is tuple:
            q = torch.cat(q, dim=-1)
        d = attn_metadata.decode
        if d is not None and applies(q, kv_c_and_k_pe_cache, d.block_table, d.seq_lens,
                                     self.kv_cache_dtype, self.dcp_world_size):
            return decode(q, kv_c_and_k_pe_cache, d.block_table, d.seq_lens, self.scale), None
        return super().forward_mqa(q, kv_c_and_k_pe_cache, attn_metadata, layer)


class MetaltuneMLABackend(TritonMLABackend):
    @staticmethod
    def get_name() -> str:
        return BACKEND

    @staticmethod
    def get_impl_cls() -> type:
        return MetaltuneMLAImpl
