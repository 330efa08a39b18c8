"""Hugging Face transformers: the tuned kernels in the user's own model, one call.

    from kernelsearch.integrations.transformers import patch, unpatch
    model = patch(AutoModelForCausalLM.from_pretrained(...))   # table=None: installed or shipped
    ...                                                        # generate / compile as usual
    unpatch(model)                                             # every replaced forward restored

What `patch` changes (only where the table has an entry for the model's own dims and dtype; a
model the table does not cover keeps the plain path, and `patched(model)` lists what changed):

- attention: the `"metaltune"` implementation (registered with transformers' AttentionInterface
  and AttentionMaskInterface). Decode steps (one query token) run `metaltune::
  decode_attention_cache`: flash-decoding over the static cache's buffer that reads only the
  filled positions (lengths from the mask, on the device: one CUDA graph serves every step) and
  every KV head once (GQA without repeat_kv); anything else (prefill, output_attentions, a float
  mask, another scaling) is transformers' own SDPA function. The model's previous implementation
  comes back on unpatch.
- `*RMSNorm` modules: `metaltune::rmsnorm` (weight in the activations' dtype, as Llama/Qwen/Mistral
  keep it);
- `*MLP` modules with gate/up/down projections and a SiLU activation: down(`metaltune::swiglu`(
  gate(x), up(x)));
- the rotary embedding of decode steps: the modeling module's `apply_rotary_pos_emb` (a module
  function transformers looks up per call) is wrapped while a model of that architecture is
  patched; the wrapper rotates q and k heads together with `metaltune::rope` for one-token steps
  and calls the original otherwise.

Module forwards are replaced per instance (an instance attribute over the class's forward), so
other models in the process are untouched, except the rotary wrapper (per modeling module, counted:
restored when the last patched model of it is unpatched or garbage-collected). Replacement goes through torch custom
ops (kernelsearch.ops), so `torch.compile(fullgraph=True)` and CUDA graphs see no graph break.

transformers' own kernel hooks (`use_kernel_forward_from_hub` / `kernelize`) need the `kernels`
package, which only loads hub repositories or local layer repositories from disk; module
replacement does the same per instance without it. Requires transformers >= 5 (the attention
interface with masks by implementation name)."""
from __future__ import annotations

import importlib
import sys
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

from kernelsearch.shipped import gpu_slug, shipped_table  # noqa: F401  (this module's API too)

ATTN = "metaltune"

_rope_refs: dict[str, list] = {}  # modeling module -> [original function, patched model count]


@dataclass
class PatchRecord:
    """What one patch changed on a model (kept on it as `_metaltune_patch`)."""

    forwards: list[tuple[Any, Any]] = field(default_factory=list)  # (module, prior instance fwd)
    attn_prev: Optional[str] = None  # the attention implementation before, when switched
    rope_modules: list[str] = field(default_factory=list)
    replaced: dict[str, int] = field(default_factory=dict)  # what -> how many
    table_device: str = ""
    release: Any = None  # weakref.finalize: the rotary wrapper's count, if never unpatched


def _require_transformers() -> Any:
    try:
        import transformers
    except ImportError:
        raise ImportError("kernelsearch.integrations.transformers needs transformers: "
                          "pip install 'metaltune[hf]'") from None
    return transformers


# -- attention ---------------------------------------------------------------------------------


def _valid_positions(mask: Any, length: int) -> tuple[bool, Any]:
    """(usable, valid [B or 1, L] bool or None) from transformers' mask for one query token."""
    import torch

    if mask is None:
        return True, None
    if mask.dtype != torch.bool or mask.dim() != 4 or mask.shape[1] != 1 or mask.shape[2] != 1 \
            or mask.shape[3] != length:
        return False, None
    return True, mask[:, 0, 0, :]


def attention(module: Any, query: Any, key: Any, value: Any, attention_mask: Any,
              dropout: float = 0.0, scaling: Optional[float] = None, is_causal: Optional[bool] = None,
              **kwargs: Any) -> tuple[Any, Any]:
    """transformers' attention-function signature: query [B, HQ, S, D], key/value [B, HKV, L, D]
    (after the cache update: a static cache hands its whole buffer) -> ([B, S, HQ, D], None)."""
    import torch

    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    D = getattr(module, "head_dim", None)  # a plain int (shapes may be symbolic under compile)
    if (isinstance(D, int) and query.shape[2] == 1 and not dropout
            and not kwargs.get("output_attentions") and kwargs.get("position_bias") is None
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
    _require_transformers()
    import kernelsearch.ops  # noqa: F401  (defines torch.ops.metaltune.*)
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTN, attention)
    AttentionMaskInterface.register(ATTN, sdpa_mask)


# -- module forwards ---------------------------------------------------------------------------


def _rmsnorm_forward(module: Any) -> Any:
    import torch

    orig = type(module).forward.__get__(module)
    eps = float(getattr(module, "variance_epsilon", getattr(module, "eps", 1e-6)))

    def forward(hidden_states: Any) -> Any:
        if hidden_states.dtype != module.weight.dtype:
            return orig(hidden_states)  # HF promotes to the weight's dtype here: keep its op
        return torch.ops.metaltune.rmsnorm(hidden_states, module.weight, eps)

    return forward


def _mlp_forward(module: Any) -> Any:
    import torch

    def forward(x: Any) -> Any:
        return module.down_proj(torch.ops.metaltune.swiglu(module.gate_proj(x), module.up_proj(x)))

    return forward


def _rope_wrapper(orig: Any) -> Any:
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


# -- coverage ----------------------------------------------------------------------------------


def _model_dims(model: Any) -> dict[str, int]:
    c = model.config
    c = getattr(c, "get_text_config", lambda: c)()
    hq = c.num_attention_heads
    return {"hidden": c.hidden_size, "ffn": getattr(c, "intermediate_size", 0), "HQ": hq,
            "HKV": getattr(c, "num_key_value_heads", None) or hq,
            "D": getattr(c, "head_dim", None) or c.hidden_size // hq,
            "act": str(getattr(c, "hidden_act", ""))}


def _covers(table: Any, family: str, dtype: str, match: dict[str, int],
            variant: Optional[str] = None) -> bool:
    return any(e.family == family and e.dtype == dtype and e.match == match
               and (variant is None or e.variant == variant) for e in table.entries)


def coverage(model: Any, table: Any) -> dict[str, bool]:
    """Which replacements the table has entries for, at the model's own dims and dtype."""
    from kernelsearch.families.base import dtype_name

    d = _model_dims(model)
    dt = dtype_name(next(model.parameters()).dtype)
    return {
        "attention": _covers(table, "decode_attention", dt,
                             {"HQ": d["HQ"], "HKV": d["HKV"], "D": d["D"]}, "flashdec"),
        "rmsnorm": _covers(table, "rmsnorm", dt, {"cols": d["hidden"]})
        or _covers(table, "rmsnorm", dt, {"cols": d["D"]}),
        "mlp": d["act"] in ("silu", "swish") and _covers(table, "swiglu", dt, {"cols": d["ffn"]}),
        "rope": _covers(table, "rope", dt, {"NH": d["HQ"] + d["HKV"], "D": d["D"]}),
    }


# -- patch / unpatch ---------------------------------------------------------------------------


def _release_rope(names: list[str]) -> None:
    """One patched model fewer for these modeling modules; the last restores the original."""
    for name in names:
        ref = _rope_refs.get(name)
        if ref is None:
            continue
        ref[1] -= 1
        if ref[1] == 0:
            importlib.import_module(name).apply_rotary_pos_emb = ref[0]
            del _rope_refs[name]


def _set_forward(rec: PatchRecord, module: Any, fwd: Any, what: str) -> None:
    rec.forwards.append((module, module.__dict__.get("forward")))
    module.forward = fwd
    rec.replaced[what] = rec.replaced.get(what, 0) + 1


def _is_mlp(m: Any) -> bool:
    import torch

    return (type(m).__name__.endswith("MLP") and all(
        isinstance(getattr(m, n, None), torch.nn.Linear) for n in ("gate_proj", "up_proj", "down_proj"))
        and (isinstance(getattr(m, "act_fn", None), torch.nn.SiLU)
             or type(getattr(m, "act_fn", None)).__name__ == "SiLUActivation"))


def _is_rmsnorm(m: Any) -> bool:
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


def patch(model: Any, table: Union[None, Any, dict, str, Path] = None, *,
          only_covered: bool = True) -> Any:
    """Install the table (None: the one already installed, else the shipped table for this GPU)
    and route the model's covered hot ops through the tuned kernels. Returns the model.
    only_covered=False replaces every module it recognises whatever the table holds (the ops
    then run torch outside it): for tracing which kernel calls the model makes."""
    _require_transformers()
    from kernelsearch import dispatch

    if getattr(model, "_metaltune_patch", None) is not None:
        unpatch(model)
    if table is not None:
        tbl = dispatch.install(table)
    else:
        tbl = dispatch.installed()
        if tbl is None:
            path = shipped_table()
            tbl = dispatch.install(path) if path is not None else None
    register()
    rec = PatchRecord(table_device=getattr(tbl, "device", ""))
    model._metaltune_patch = rec
    if tbl is None:
        return model  # no table: the plain path everywhere
    cov = coverage(model, tbl) if only_covered else dict.fromkeys(
        ("attention", "rmsnorm", "mlp", "rope"), True)
    for m in model.modules():
        if cov["rmsnorm"] and _is_rmsnorm(m):
            _set_forward(rec, m, _rmsnorm_forward(m), "rmsnorm")
        elif cov["mlp"] and _is_mlp(m):
            _set_forward(rec, m, _mlp_forward(m), "mlp")
    if cov["rope"]:
        for m in model.modules():
            mod = sys.modules.get(type(m).__module__)
            if (type(m).__name__.endswith("Attention") and mod is not None
                    and callable(getattr(mod, "apply_rotary_pos_emb", None))
                    and mod.__name__ not in rec.rope_modules):
                ref = _rope_refs.setdefault(mod.__name__, [mod.apply_rotary_pos_emb, 0])
                if ref[1] == 0:
                    mod.apply_rotary_pos_emb = _rope_wrapper(ref[0])
                ref[1] += 1
                rec.rope_modules.append(mod.__name__)
                rec.replaced["rope"] = rec.replaced.get("rope", 0) + 1
    if rec.rope_modules:  # a patched model dropped without unpatch releases its count too
        rec.release = weakref.finalize(model, _release_rope, list(rec.rope_modules))
    if cov["attention"]:
        prev = model.config._attn_implementation
        if prev != ATTN:
            model.set_attn_implementation(ATTN)
            rec.attn_prev = prev
        rec.replaced["attention"] = 1
    return model


def unpatch(model: Any) -> Any:
    """Undo `patch`: every replaced forward, the rotary function and the attention
    implementation as they were. Returns the model (a model never patched is returned as is)."""
    rec: Optional[PatchRecord] = getattr(model, "_metaltune_patch", None)
    if rec is None:
        return model
    for module, prior in reversed(rec.forwards):
        if prior is None:
            module.__dict__.pop("forward", None)
        else:
            module.forward = prior
    if rec.release is not None and rec.release.detach() is not None:
        _release_rope(rec.rope_modules)
    if rec.attn_prev is not None:
        model.set_attn_implementation(rec.attn_prev)
    model._metaltune_patch = None
    return model


def patched(model: Any) -> dict[str, int]:
    """What patch replaced on this model ({} if nothing, or never patched)."""
    rec = getattr(model, "_metaltune_patch", None)
    return dict(rec.replaced) if rec is not None else {}
