"""The layers themselves. `kernels` requires them stateless (no constructor, no members besides
`forward` and its two flags) with the forward signature of the layer they replace; `forward` is
bound to the replaced module, so `self` is transformers' own RMSNorm (its weight and epsilon)."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

import kernelsearch.ops  # noqa: F401  (defines torch.ops.metaltune.*)


class RMSNorm(nn.Module):
    """transformers' `RMSNorm` hub layer (Llama, Qwen2, Qwen3, Mistral): w * x / rms(x)."""

    can_torch_compile = True  # custom ops: no graph break
    has_backward = False      # inference only

    def forward(self, hidden_states: Any) -> Any:
        w = self.weight
        eps = float(getattr(self, "variance_epsilon", getattr(self, "eps", 1e-6)))
        if hidden_states.dtype != w.dtype:  # transformers promotes here: its own arithmetic
            x = hidden_states.to(torch.float32)
            x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
            return w * x.to(hidden_states.dtype)
        return torch.ops.metaltune.rmsnorm(hidden_states, w, eps)


class RotaryPosEmb(nn.Module):
    """transformers' `rotary_pos_emb` hub function (apply_rotary_pos_emb): one launch for q and
    k heads of a one-token step, transformers' own formula otherwise."""

    can_torch_compile = True
    has_backward = False

    def forward(self, q: Any, k: Any, cos: Any, sin: Any, unsqueeze_dim: Any = 1) -> Any:
        if (unsqueeze_dim == 1 and q.dim() == 4 and k.dim() == 4 and q.shape[2] == 1
                and k.shape[2] == 1 and cos.dim() == 3 and cos.shape[1] == 1
                and cos.shape[-1] == q.shape[-1] and cos.shape[0] in (1, q.shape[0])
                and q.dtype == k.dtype):
            hq, h = q.shape[1], q.shape[-1] // 2
            x = torch.cat([q[:, :, 0], k[:, :, 0]], dim=1)
            out = torch.ops.metaltune.rope(x, cos[:, 0, :h].float(), sin[:, 0, :h].float())
            return out[:, :hq].unsqueeze(2), out[:, hq:].unsqueeze(2)
        c, s = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)

        def half(t: Any) -> Any:
            return torch.cat((-t[..., t.shape[-1] // 2:], t[..., : t.shape[-1] // 2]), dim=-1)

        return q * c + half(q) * s, k * c + half(k) * s
