"""The "metaltune" attention implementation for transformers: decode steps through
`metaltune::decode_attention_cache`, a call that asks for the weights through the model's own
eager attention, anything else through transformers' SDPA function; `register` names it
with transformers' AttentionInterface and AttentionMaskInterface."""
from __future__ import annotations

import sys
from typing import Any, Optional

ATTN = "metaltune"


def require_transformers() -> Any:
    try:
        import transformers
    except ImportError:
        raise ImportError("kernelsearch.integrations.transformers needs transformers: "
                          "pip install 'metaltune[hf]'") from None
    return transformers


def _valid_positions(mask: Any, length: int) -> tuple[bool, Any]:
    """(usable, valid [B or 1, L] bool or None) from transformers' mask for one query token."""
    import torch

    if mask is None:
        return True, None
    if mask.dtype != torch.bool or mask.dim() != 4 or mask.shape[1] != 1 or mask.shape[2] != 1 \
            or mask.shape[3] != length:
        return False, None
    return True, mask[:, 0, 0, :]


def _wants_weights(module: Any, kwargs: dict[str, Any]) -> bool:
    flag = kwargs.get("output_attentions")
    if flag is None:
        flag = getattr(getattr(module, "config", None), "output_attentions", False)
    return bool(flag)


def _own_attention(module: Any, query: Any, key: Any, value: Any, attention_mask: Any,
                   dropout: float, scaling: Optional[float], **kwargs: Any) -> Optional[tuple[Any, Any]]:
    """The model's own eager attention (its modeling module's `eager_attention_forward`), which
    returns the weights; the boolean (or absent, causal) mask of the SDPA path made additive."""
    import torch

    eager = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
    if eager is None:
        return None
    S, L = query.shape[2], key.shape[2]
    mask = attention_mask
    if mask is None and S > 1 and getattr(module, "is_causal", True):
        # SDPA's mask is skipped for a plain causal prefill: the queries are the last S positions
        i = torch.arange(S, device=query.device)[:, None]
        j = torch.arange(L, device=query.device)[None, :]
        mask = (j <= i + (L - S))[None, None]
    if mask is not None and mask.dtype == torch.bool:
        mask = torch.zeros(mask.shape, dtype=query.dtype, device=query.device).masked_fill(
            ~mask, torch.finfo(query.dtype).min)
    if scaling is None:
        scaling = getattr(module, "scaling", query.shape[-1] ** -0.5)
    return eager(module, query, key, value, mask, scaling=scaling, dropout=dropout, **kwargs)


def attention(module: Any, query: Any, key: Any, value: Any, attention_mask: Any,
              dropout: float = 0.0, scaling: Optional[float] = None, is_causal: Optional[bool] = None,
              **kwargs: Any) -> tuple[Any, Any]:
    """transformers' attention-function signature: query [B, HQ, S, D], key/value [B, HKV, L, D]
    (after the cache update: a static cache hands its whole buffer) -> ([B, S, HQ, D], None);
    the weights too when the call asks for them (the model's own attention then)."""
    import torch

    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if _wants_weights(module, kwargs):
        out = _own_attention(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
        if out is not None:
            return out
    D = getattr(module, "head_dim", None)  # a plain int (shapes may be symbolic under compile)
    if (isinstance(D, int) and query.shape[2] == 1 and not dropout
            and kwargs.get("position_bias") is None
            and query.shape[-1] == D and key.shape[-1] == D and value.shape[-1] == D
            and query.shape[1] % key.shape[1] == 0
            and (scaling is None or abs(scaling * D ** 0.5 - 1.0) < 1e-6)):
        ok, valid = _valid_positions(attention_mask, key.shape[2])
        if ok:
            out = torch.ops.metaltune.decode_attention_cache(query[:, :, 0], key, value, valid)
            return out.unsqueeze(1), None
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                  scaling=scaling, is_causal=is_causal, **kwargs)


def register() -> None:
    """Register `attn_implementation="metaltune"` (attention and its mask, the SDPA one), so
    `from_pretrained(..., attn_implementation="metaltune")` works too (idempotent)."""
    require_transformers()
    import kernelsearch.ops  # noqa: F401  (defines torch.ops.metaltune.*)
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTN, attention)
    AttentionMaskInterface.register(ATTN, sdpa_mask)
