"""Library variant: flash-attn's flash_attn_with_kvcache for GQA decode. The family's cache
[B, HKV, L, D] is flash-attn's [B, L, HKV, D] with other strides (a transposed view, no copy:
flash-attn takes any strides with a unit last one); q [B, HQ, D] is one query token."""
from kernelsearch import libraries


def prepare(q, k, v):
    return q.unsqueeze(1), k.transpose(1, 2), v.transpose(1, 2)


def run(q4, k4, v4):
    fa = libraries.module("flash_attn")
    return fa.flash_attn_with_kvcache(q4, k4, v4).squeeze(1)


def forward(q, k, v):
    return run(*prepare(q, k, v))
