"""Hugging Face transformers: the tuned kernels in the user's own model, one call.

    from kernelsearch.integrations.transformers import patch, unpatch
    model = patch(AutoModelForCausalLM.from_pretrained(...))   # table=None: installed or shipped
    ...                                                        # generate / compile as usual
    unpatch(model)                                             # every replaced forward restored

What `patch` changes (only where the table has an entry for the model's own dims and dtype; a
model the table does not cover keeps the plain path, and `patched(model)` lists what changed). It
logs what it patched, and warns (UserWarning, with the reason) when it patched nothing: no table
for this GPU, a table for another device, a model on the CPU (the kernels run on CUDA tensors,
or under TRITON_INTERPRET=1), or a model with no module it knows.

- attention: the `"metaltune"` implementation (registered with transformers' AttentionInterface
  and AttentionMaskInterface), only in place of transformers' default `"sdpa"` (what it runs
  outside its decode kernel anyway): a model loaded with another implementation (`"eager"`,
  flash-attention, flex) keeps the user's choice (`attention=True` switches it anyway). Decode
  steps (one query token) run `metaltune::decode_attention_cache`: flash-decoding over the static
  cache's buffer that reads only the filled positions (lengths from the mask, on the device: one
  CUDA graph serves every step) and every KV head once (GQA without repeat_kv); a call that asks
  for attention weights (`output_attentions=True`) runs the model's own eager attention and
  returns them; anything else (prefill, a float mask, another scaling) is transformers' own SDPA
  function. `model.set_attn_implementation(...)` away from `"metaltune"` and back works as on
  any model; unpatch restores the previous implementation unless the user switched since.
- `*RMSNorm` modules: `metaltune::rmsnorm` (weight in the activations' dtype, as Llama/Qwen/Mistral
  keep it);
- `*MLP` modules with gate/up/down projections and a SiLU activation: down(`metaltune::swiglu`(
  gate(x), up(x)));
- the rotary embedding of decode steps: the modeling module's `apply_rotary_pos_emb` (a module
  function transformers looks up per call) is wrapped while a model of that architecture is
  patched; the wrapper rotates q and k heads together with `metaltune::rope` for one-token steps
  and calls the original otherwise.

Module forwards are replaced per instance (an instance attribute over the class's forward: a
small callable object holding its module, so `copy.deepcopy` of a patched model computes with
the copy's weights and `torch.save`/pickle work), so other models in the process are untouched,
except the rotary wrapper (per modeling module, counted: restored when the last patched model of
it, or copy of one, is unpatched or garbage-collected). Replacement goes through torch custom ops
(kernelsearch.ops), so `torch.compile(fullgraph=True)` and CUDA graphs see no graph break.

transformers' own kernel hooks route: `use_kernels(model)` (beside `patch`) hands the `kernels`
package (0.16.x, the range transformers 5.17 accepts) a mapping from transformers' hub layer
names (`RMSNorm`, `rotary_pos_emb`) to metaltune's local layer repository
(`kernelsearch/integrations/hub/`), and calls its `kernelize`: the same custom ops, chosen per
shape by the same table. Requires transformers >= 5 (the attention interface with masks by
implementation name).

Beside this module: `transformers_attention` (the "metaltune" attention implementation and
`register`), `transformers_forwards` (the module forwards, the rotary wrapper, which modules
qualify)."""
from __future__ import annotations

import os
import sys
import warnings
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

from kernelsearch.integrations.feedback import Feedback
# attention and register: this module's API too (the "metaltune" implementation it registers)
from kernelsearch.integrations.transformers_attention import (  # noqa: F401
    ATTN, attention, register, require_transformers)
from kernelsearch.integrations.transformers_forwards import (Forward, acquire_rope, is_mlp,
                                                             is_rmsnorm, release_rope)
from kernelsearch.shipped import gpu_slug, shipped_table  # noqa: F401  (this module's API too)

DEFAULT_ATTN = "sdpa"  # transformers' default: the one implementation patch replaces by itself
log = Feedback(__name__)  # the patch line shows without any logging set up


def _canary_removed(incident: dict) -> None:
    """A kernel canary listener: an entry removed in this process is said as a warning (the
    user's model keeps running, slower, on its own code for those calls) with where it is
    recorded (the incident log `metaltune status` reads)."""
    n = int(incident.get("removed_entries") or 0)
    log.log.warning(
        "metaltune: the kernel canary found %s %s computing wrong at shape %s %s (%s); %d table "
        "entr%s removed, those calls run the model's own code (recorded in %s)",
        incident.get("family"), incident.get("variant"), incident.get("shape"),
        incident.get("dtype"), str(incident.get("detail", ""))[:300], n,
        "y" if n == 1 else "ies", incident.get("log") or "no incident log")


class NothingPatched(UserWarning):
    """`patch` (or `use_kernels`) left the model as it was; the message says why."""

@dataclass
class PatchRecord:
    """What one patch changed on a model (kept on it as `_metaltune_patch`)."""

    forwards: list[tuple[Any, Any]] = field(default_factory=list)  # (module, prior instance fwd)
    attn_prev: Optional[str] = None  # the attention implementation before, when switched
    rope_modules: list[str] = field(default_factory=list)
    replaced: dict[str, int] = field(default_factory=dict)  # what -> how many
    table_device: str = ""
    release: Any = None  # weakref.finalize: the rotary wrapper's count, if never unpatched
    attn_kept: Optional[str] = None  # the user's own attention implementation, left in place

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "release"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        """A deepcopy or an unpickled copy of a patched model: it takes its own count on the
        rotary wrappers (released with this record) and finds "metaltune" registered."""
        self.__dict__.update(state)
        self.release = None
        if self.replaced.get("attention") or self.rope_modules:
            register()
        if self.rope_modules:
            acquire_rope(self.rope_modules)
            self.release = weakref.finalize(self, release_rope, list(self.rope_modules))


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


def _set_forward(rec: PatchRecord, module: Any, what: str) -> None:
    rec.forwards.append((module, module.__dict__.get("forward")))
    module.forward = Forward(module, what)
    rec.replaced[what] = rec.replaced.get(what, 0) + 1


# what a table's `device` says when it names no GPU model (built in code, by a search on "cuda",
# or under the CPU interpreter): nothing to compare
GENERIC_DEVICES = ("", "cuda", "cpu", "cpu-interpreter")


def _model_device(model: Any) -> Any:
    p = next(iter(model.parameters()), None)
    return None if p is None else p.device


def _why_not(model: Any, tbl: Any) -> Optional[str]:
    """Why no kernel of the table can run in this model (None: some may)."""
    import torch

    from kernelsearch.shipped import device_name

    if tbl is None:
        gpu = device_name()
        return ("no dispatch table: none installed and none shipped for "
                + (gpu if gpu else "a process without a GPU") + " (pass table=...)")
    dev = _model_device(model)
    if dev is None:
        return "the model has no parameters"
    if dev.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        return (f"the model is on {dev.type}: the kernels run on CUDA tensors (or under "
                "Triton's interpreter, TRITON_INTERPRET=1)")
    if tbl.device not in GENERIC_DEVICES:  # a GPU's name: the one it was tuned and verified on
        here = torch.cuda.get_device_name(dev) if dev.type == "cuda" else None
        if here is None or gpu_slug(tbl.device) != gpu_slug(here):
            return (f"the table was tuned and verified on {tbl.device}, this model runs on "
                    f"{here or dev.type} (install a table measured there, or search one)")
    return None


def _install(table: Any) -> Any:
    """The table to use (installed now): the one given, else the installed one, else the one
    shipped for this GPU; None without any."""
    from kernelsearch import dispatch

    if table is not None:
        return dispatch.install(table)
    tbl = dispatch.installed()
    if tbl is None:
        path = shipped_table()
        tbl = dispatch.install(path) if path is not None else None
    return tbl


def _nothing(model: Any, why: str) -> None:
    warnings.warn(f"metaltune: nothing patched on {type(model).__name__}: {why}", NothingPatched,
                  stacklevel=3)


def patch(model: Any, table: Union[None, Any, dict, str, Path] = None, *,
          only_covered: bool = True, attention: Optional[bool] = None) -> Any:
    """Install the table (None: the one already installed, else the shipped table for this GPU)
    and route the model's covered hot ops through the tuned kernels. Returns the model; logs
    what changed, and warns (NothingPatched) with the reason when nothing did.
    only_covered=False replaces every module it recognises whatever the table holds (the ops
    then run torch outside it): for tracing which kernel calls the model makes.
    attention: None switches transformers' default "sdpa" to "metaltune" and keeps any other
    implementation the user chose; True switches whatever it is; False never switches."""
    require_transformers()
    from kernelsearch import dispatch

    if getattr(model, "_metaltune_patch", None) is not None:
        unpatch(model)
    tbl = _install(table)
    register()
    from kernelsearch import canary

    if _canary_removed not in canary.listeners:
        canary.add_listener(_canary_removed)
    rec = PatchRecord(table_device=getattr(tbl, "device", ""))
    model._metaltune_patch = rec
    why = _why_not(model, tbl) if only_covered or tbl is None else None
    if why:
        _nothing(model, why)
        return model
    cov = coverage(model, tbl) if only_covered else dict.fromkeys(
        ("attention", "rmsnorm", "mlp", "rope"), True)
    for m in model.modules():
        if cov["rmsnorm"] and is_rmsnorm(m):
            _set_forward(rec, m, "rmsnorm")
        elif cov["mlp"] and is_mlp(m):
            _set_forward(rec, m, "mlp")
    if cov["rope"]:
        for m in model.modules():  # the module function the class calls (see use_kernels too)
            mod = sys.modules.get(type(m).__module__)
            if (type(m).__name__.endswith("Attention") and mod is not None
                    and callable(getattr(mod, "apply_rotary_pos_emb", None))
                    and mod.__name__ not in rec.rope_modules):
                rec.rope_modules.append(mod.__name__)
        acquire_rope(rec.rope_modules)
        if rec.rope_modules:
            rec.replaced["rope"] = len(rec.rope_modules)
    if rec.rope_modules:  # a patched model dropped without unpatch releases its count too
        rec.release = weakref.finalize(rec, release_rope, list(rec.rope_modules))
    if cov["attention"]:
        prev = model.config._attn_implementation
        if prev == ATTN:
            rec.replaced["attention"] = 1
        elif attention or (attention is None and prev in (DEFAULT_ATTN, None)):
            model.set_attn_implementation(ATTN)
            rec.attn_prev = prev
            rec.replaced["attention"] = 1
        else:
            rec.attn_kept = prev  # the user's choice: theirs to switch (attention=True)
    if rec.replaced:
        log.info("metaltune: patched %s: %s%s", type(model).__name__,
                 ", ".join(f"{k} x{v}" for k, v in rec.replaced.items()),
                 f" (attention kept as {rec.attn_kept!r}, the model's own)" if rec.attn_kept else "")
    elif rec.attn_kept and not any(v for k, v in cov.items() if k != "attention"):
        _nothing(model, f"the table covers only its attention, and the model runs "
                        f"{rec.attn_kept!r} (patch(..., attention=True) switches it)")
    elif any(cov.values()):
        _nothing(model, "no module of it is one metaltune replaces (RMSNorm, a SiLU-gated MLP, "
                        "rotary embedding, attention of Llama-like models)")
    elif not tbl.entries:  # torch everywhere, asked for (a search's all-torch incumbent)
        log.info("metaltune: %s left plain: the table has no entries", type(model).__name__)
    else:
        d = _model_dims(model)
        _nothing(model, f"the table ({tbl.device or 'no device'}) has no entry at its dims and "
                        f"dtype (hidden {d['hidden']}, ffn {d['ffn']}, heads {d['HQ']}/{d['HKV']}, "
                        f"head dim {d['D']})")
    return model


def unpatch(model: Any) -> Any:
    """Undo `patch`: every replaced forward, the rotary function and the attention
    implementation as they were (unless the user switched it since). Returns the model (a
    model never patched is returned as is)."""
    rec: Optional[PatchRecord] = getattr(model, "_metaltune_patch", None)
    if rec is None:
        return model
    for module, prior in reversed(rec.forwards):
        if prior is None:
            module.__dict__.pop("forward", None)
        else:
            module.forward = prior
    if rec.release is not None and rec.release.detach() is not None:
        release_rope(rec.rope_modules)
    if rec.attn_prev is not None and model.config._attn_implementation == ATTN:
        model.set_attn_implementation(rec.attn_prev)
    model._metaltune_patch = None
    return model


# -- the `kernels` package route ------------------------------------------------------------

HUB = Path(__file__).resolve().parent / "hub"  # a `kernels` local layer repository
HUB_LAYERS = {"RMSNorm": "RMSNorm", "rotary_pos_emb": "RotaryPosEmb"}  # hub name -> our layer
KERNELS_RANGE = ((0, 16), (0, 17))  # what transformers 5.17 accepts (0.17's kernelize replaces nothing)


def _kernels() -> Any:
    try:
        import kernels
    except ImportError:
        raise ImportError("use_kernels needs the kernels package (0.16.x): "
                          "pip install 'metaltune[hf]'") from None
    ver = tuple(int(p) for p in kernels.__version__.split(".")[:2] if p.isdigit())
    if not KERNELS_RANGE[0] <= ver < KERNELS_RANGE[1]:
        raise ImportError(f"use_kernels needs kernels >=0.16,<0.17 (the range transformers 5.17 "
                          f"accepts); this environment has {kernels.__version__}")
    return kernels


def _hub_targets(model: Any) -> list[tuple[Any, str]]:
    """(module, hub name) for every layer kernelize touches (it sets a forward on each, ours or
    its fallback): transformers' marked modules and the function layers attached to them
    (`use_kernelized_func`), each once."""
    out, seen = [], set()
    for m in model.modules():
        for f in [m, *getattr(m, "_kernel_funcs", {}).values()]:
            name = getattr(type(f), "kernel_layer_name", None)
            if name is not None and id(f) not in seen:
                seen.add(id(f))
                out.append((f, name))
    return out


def use_kernels(model: Any, table: Union[None, Any, dict, str, Path] = None, *,
                device: Optional[str] = None) -> Any:
    """transformers' own kernel route (what `use_kernels=True` does with hub repositories):
    the `kernels` package's `kernelize` with a mapping from the hub layer names transformers
    marks (RMSNorm, rotary_pos_emb) to metaltune's local layer repository. The table is chosen
    and installed as `patch` does; `unpatch` undoes it. As with `kernels` itself, a function
    layer (rotary_pos_emb) is one object shared by every model of that architecture in the
    process. Returns the model; warns (NothingPatched) when nothing was replaced."""
    require_transformers()
    kernels = _kernels()
    if getattr(model, "_metaltune_patch", None) is not None:
        unpatch(model)
    tbl = _install(table)
    register()
    rec = PatchRecord(table_device=getattr(tbl, "device", ""))
    model._metaltune_patch = rec
    why = _why_not(model, tbl)
    if why:
        _nothing(model, why)
        return model
    dev = device or _model_device(model).type
    targets = _hub_targets(model)
    before = [(m, m.__dict__.get("forward")) for m, _ in targets]
    mapping = {name: {dev: kernels.LocalLayerRepository(repo_path=HUB, layer_name=layer)}
               for name, layer in HUB_LAYERS.items()}
    with warnings.catch_warnings():  # "no mapping for layer X": the layers we do not offer
        warnings.filterwarnings("ignore", message=r"\s*No kernel mapping found")
        with kernels.use_kernel_mapping(mapping, inherit_mapping=False):
            kernels.kernelize(model, mode=kernels.Mode.INFERENCE, device=dev)
    for (m, prior), (_, name) in zip(before, targets):
        now = m.__dict__.get("forward")
        if now is not prior:  # unpatch puts back what was there, fallbacks included
            rec.forwards.append((m, prior))
        fn = getattr(now, "__func__", None)
        if fn is not None and Path(fn.__code__.co_filename).parent == HUB:
            key = f"kernels:{name}"
            rec.replaced[key] = rec.replaced.get(key, 0) + 1
    if rec.replaced:
        log.info("metaltune: kernelized %s: %s", type(model).__name__,
                 ", ".join(f"{k} x{v}" for k, v in rec.replaced.items()))
    else:
        _nothing(model, "it marks no layer metaltune's hub repository has "
                        f"({', '.join(HUB_LAYERS)}) for transformers' kernels route")
    return model


def patched(model: Any) -> dict[str, int]:
    """What patch replaced on this model ({} if nothing, or never patched)."""
    rec = getattr(model, "_metaltune_patch", None)
    return dict(rec.replaced) if rec is not None else {}
