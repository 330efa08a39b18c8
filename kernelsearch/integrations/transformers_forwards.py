"""The module forwards `patch` puts on a model: RMSNorm through `metaltune::rmsnorm`, a
SiLU-gated MLP through `metaltune::swiglu`, and the decode steps' rotary embedding through
`metaltune::rope` (a modeling module's function, wrapped while a model of it is patched: counted
per module); and which modules qualify."""
from __future__ import annotations

import importlib
from typing import Any

_rope_refs: dict[str, list] = {}  # modeling module -> [original function, patched model count]


def _rmsnorm_forward(module: Any, hidden_states: Any) -> Any:
    import torch

    if hidden_states.dtype != module.weight.dtype:
        return type(module).forward(module, hidden_states)  # HF promotes here: keep its op
    eps = float(getattr(module, "variance_epsilon", getattr(module, "eps", 1e-6)))
    return torch.ops.metaltune.rmsnorm(hidden_states, module.weight, eps)


def _mlp_forward(module: Any, x: Any) -> Any:
    import torch

    return module.down_proj(torch.ops.metaltune.swiglu(module.gate_proj(x), module.up_proj(x)))


FORWARDS = {"rmsnorm": _rmsnorm_forward, "mlp": _mlp_forward}


class Forward:
    """A module's replaced forward. The module is an attribute, not a closure cell: a deepcopy
    of the model gives the copy's module its own (computing with the copy's weights), and the
    model pickles (a module-level class, found by name)."""

    def __init__(self, module: Any, kind: str) -> None:
        self.module, self.kind = module, kind

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return FORWARDS[self.kind](self.module, *args, **kwargs)

    def __repr__(self) -> str:
        return f"<metaltune {self.kind} forward of {type(self.module).__name__}>"


def rope_wrapper(orig: Any) -> Any:
    import torch

    def apply_rotary_pos_emb(q: Any, k: Any, cos: Any, sin: Any, unsqueeze_dim: int = 1,
                             *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        if (args or kwargs or unsqueeze_dim != 1 or q.dim() != 4 or k.dim() != 4
                or q.shape[2] != 1 or k.shape[2] != 1 or cos.dim() != 3 or cos.shape[1] != 1
                or cos.shape[-1] != q.shape[-1] or cos.shape[0] not in (1, q.shape[0])
                or q.dtype != k.dtype):
            return orig(q, k, cos, sin, unsqueeze_dim, *args, **kwargs)
        B, HQ, _, D = q.shape
        HKV = k.shape[1]
        x = torch.cat([q[:, :, 0], k[:, :, 0]], dim=1)  # [B, HQ + HKV, D]: one launch
        h = D // 2  # HF's tables repeat the angles over both halves: the family takes one
        out = torch.ops.metaltune.rope(x, cos[:, 0, :h].float(), sin[:, 0, :h].float())
        return out[:, :HQ].unsqueeze(2), out[:, HQ:HQ + HKV].unsqueeze(2)

    apply_rotary_pos_emb.__wrapped__ = orig  # type: ignore[attr-defined]
    return apply_rotary_pos_emb


def acquire_rope(names: list[str]) -> None:
    """One patched model more for these modeling modules; the first wraps the function."""
    for name in names:
        mod = importlib.import_module(name)
        ref = _rope_refs.setdefault(name, [mod.apply_rotary_pos_emb, 0])
        if ref[1] == 0:
            mod.apply_rotary_pos_emb = rope_wrapper(ref[0])
        ref[1] += 1


def release_rope(names: list[str]) -> None:
    """One patched model fewer for these modeling modules; the last restores the original."""
    for name in names:
        ref = _rope_refs.get(name)
        if ref is None:
            continue
        ref[1] -= 1
        if ref[1] == 0:
            importlib.import_module(name).apply_rotary_pos_emb = ref[0]
            del _rope_refs[name]


def is_mlp(m: Any) -> bool:
    import torch

    return (type(m).__name__.endswith("MLP") and all(
        isinstance(getattr(m, n, None), torch.nn.Linear) for n in ("gate_proj", "up_proj", "down_proj"))
        and (isinstance(getattr(m, "act_fn", None), torch.nn.SiLU)
             or type(getattr(m, "act_fn", None)).__name__ == "SiLUActivation"))


def is_rmsnorm(m: Any) -> bool:
    """An RMSNorm computing w * x / rms(x) (Llama, Qwen, Mistral), checked on a probe input
    against F.rms_norm: Gemma-style (1 + w) norms and others keep their own forward."""
    import torch
    import torch.nn.functional as F

    w = getattr(m, "weight", None)
    if not (type(m).__name__.endswith("RMSNorm") and isinstance(w, torch.Tensor) and w.dim() == 1
            and (hasattr(m, "variance_epsilon") or hasattr(m, "eps"))):
        return False
    if w.device.type == "meta":
        return False  # not materialised yet: nothing to probe (patch after loading)
    eps = float(getattr(m, "variance_epsilon", getattr(m, "eps", 1e-6)))
    with torch.no_grad():
        x = torch.randn(2, w.shape[0], device=w.device, generator=torch.Generator(
            device=w.device).manual_seed(0)).to(w.dtype)
        probe = w.detach().clone().uniform_(0.5, 1.5, generator=torch.Generator(
            device=w.device).manual_seed(1))
        saved = w.detach().clone()
        try:
            w.copy_(probe)  # a norm initialised to ones would hide a (1 + w) form
            ours, theirs = F.rms_norm(x, (w.shape[0],), w, eps), type(m).forward(m, x)
        finally:
            w.copy_(saved)
    return theirs.dtype == ours.dtype and torch.allclose(ours.float(), theirs.float(),
                                                         rtol=2e-2, atol=2e-2)
