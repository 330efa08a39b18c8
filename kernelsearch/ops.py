"""Every kernel family as a torch custom op, `torch.ops.metaltune.<family>`, so model code under
`torch.compile(fullgraph=True)` or CUDA graph capture calls the tuned kernels with no graph break:

    import kernelsearch.ops                       # registers them (kernelsearch.ops.register_all())
    y = torch.ops.metaltune.rmsnorm(x, w, 1e-6)  # the installed dispatch table picks the kernel

The ops are generated from the family registry (`kernelsearch.families.NAMES`): the schema from
the family's signature and the argument types of its tiny inputs, the fake (meta) implementation
from `out_spec`, the real one is `dispatch.call` (a table kernel inside its validated ranges, the
family's `torch_default` outside them), and the backward recomputes `torch_default` (the kernels
are forward-only; training through an op gets torch's gradient). A family added to the registry
gets its op with no change here.

`metaltune::decode_attention_cache(q, k, v, valid)` is the static-cache form for model code that
keeps a preallocated KV buffer (Hugging Face's StaticCache): k, v are the whole buffer and `valid`
(bool [B or 1, L], the attention mask's row; None: every position) says which positions attend.
The flashdec kernel reads the filled lengths and the mask from device memory, so a CUDA graph
captured once serves every step; it reads each KV head once (GQA without repeating K/V). The torch
path is SDPA over the whole buffer with the mask (what transformers runs itself)."""
from __future__ import annotations

import inspect
import re
from typing import Any, Callable, Optional

NAMESPACE = "metaltune"
CACHE_OP = "decode_attention_cache"

_ops: dict[str, Any] = {}


def _param_names(fam: Any) -> list[str]:
    m = re.fullmatch(r"\s*forward\((.*)\)\s*", fam.signature)
    if m is None:
        raise ValueError(f"family {fam.name}: signature {fam.signature!r} is not forward(...)")
    return [p.strip() for p in m.group(1).split(",") if p.strip()]


def schema_of(fam: Any) -> str:
    """The op schema, e.g. "(Tensor x, Tensor weight, float eps) -> Tensor": names from the
    family's signature, types from its tiny inputs (make_inputs on the CPU)."""
    import torch

    names = _param_names(fam)
    dt = "float32" if "float32" in fam.dtypes else fam.dtypes[-1]
    args = fam.make_inputs(fam.tiny_shapes[0], dt, "cpu", torch.Generator().manual_seed(0))
    if len(args) != len(names):
        raise ValueError(f"family {fam.name}: signature names {len(names)} arguments, "
                         f"make_inputs gives {len(args)}")
    kinds = []
    for n, a in zip(names, args):
        if isinstance(a, torch.Tensor):
            kinds.append(f"Tensor {n}")
        elif isinstance(a, bool):
            kinds.append(f"bool {n}")
        elif isinstance(a, int):
            kinds.append(f"int {n}")
        elif isinstance(a, float):
            kinds.append(f"float {n}")
        else:
            raise ValueError(f"family {fam.name}: argument {n} of type {type(a).__name__} has no "
                             f"op schema type")
    return "(" + ", ".join(kinds) + ") -> Tensor"


def _first_tensor(args: tuple) -> Any:
    import torch

    return next(a for a in args if isinstance(a, torch.Tensor))


def _recompute_backward(default: Callable) -> tuple[Callable, Callable]:
    """Autograd for a forward-only kernel: the gradient of the torch op on the saved inputs."""
    import torch

    def setup_context(ctx: Any, inputs: tuple, output: Any) -> None:
        ctx.is_tensor = [isinstance(a, torch.Tensor) for a in inputs]
        ctx.others = [None if t else a for a, t in zip(inputs, ctx.is_tensor)]
        ctx.save_for_backward(*(a for a, t in zip(inputs, ctx.is_tensor) if t))

    def backward(ctx: Any, grad: Any) -> tuple:
        saved = iter(ctx.saved_tensors)
        args = [next(saved).detach().requires_grad_(True) if t else o
                for t, o in zip(ctx.is_tensor, ctx.others)]
        leaves = [a for a, t in zip(args, ctx.is_tensor) if t]
        with torch.enable_grad():
            out = default(*args)
        grads = iter(torch.autograd.grad(out, leaves, grad, allow_unused=True))
        return tuple(next(grads) if t else None for t in ctx.is_tensor)

    return setup_context, backward


def register(name: str) -> Any:
    """Define `metaltune::<name>` for a family (once per process); returns the op."""
    if name in _ops:
        return _ops[name]
    import torch

    from kernelsearch import dispatch
    from kernelsearch.families import get

    fam = get(name)

    def impl(*args: Any) -> Any:
        out = dispatch.call(name, *args)
        return out if out.is_contiguous() else out.contiguous()  # the fake's layout

    def fake(*args: Any) -> Any:
        shape, dt = fam.out_spec(*args)
        return _first_tensor(args).new_empty(shape, dtype=dt)

    # custom_op reads the parameters from the function's signature: give it the family's
    names = _param_names(fam)
    sig = inspect.Signature([inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD)
                             for n in names])
    impl.__signature__ = sig  # type: ignore[attr-defined]
    fake.__signature__ = sig  # type: ignore[attr-defined]
    op = torch.library.custom_op(f"{NAMESPACE}::{name}", impl, mutates_args=(),
                                 schema=schema_of(fam))
    op.register_fake(fake)
    setup, backward = _recompute_backward(fam.torch_default)
    op.register_autograd(backward, setup_context=setup)
    _ops[name] = op
    return op


def _lengths(valid: Any, batch: int) -> Any:
    """Filled positions per sequence: one past the last valid position (int32 [B]), on the
    device, with no host sync (a CUDA graph captures it)."""
    import torch

    # a fresh arange per call, never a cached one: a tensor created lazily inside a CUDA graph
    # (inductor's cudagraph trees record in a private pool) and kept past the step is a live
    # allocation the pool does not track, and the next recording fails (seen on the H200)
    pos = torch.arange(1, valid.shape[-1] + 1, dtype=torch.int32, device=valid.device)
    lens = (valid.to(torch.int32) * pos).amax(-1).to(torch.int32)
    return lens.expand(batch).contiguous() if lens.shape[0] != batch else lens


def cache_attention_torch(q: Any, k: Any, v: Any, valid: Optional[Any]) -> Any:
    """SDPA over the whole buffer with the mask (transformers' own static-cache decode)."""
    import torch.nn.functional as F

    mask = None if valid is None else valid[:, None, None, :]
    return F.scaled_dot_product_attention(q.unsqueeze(2), k, v, attn_mask=mask,
                                          enable_gqa=q.shape[1] != k.shape[1]).squeeze(2)


def _register_cache_op() -> Any:
    if CACHE_OP in _ops:
        return _ops[CACHE_OP]
    import torch

    from kernelsearch import dispatch

    def impl(q: Any, k: Any, v: Any, valid: Optional[Any]) -> Any:
        from kernelsearch.families.decode_attention import flashdec

        fn = dispatch.resolve("decode_attention", q, k, v)
        if fn is not None and getattr(fn, "func", None) is flashdec.forward and (
                valid is None or valid.dim() == 2 and valid.shape[0] in (1, q.shape[0])):
            from kernelsearch.runtime import ensure_scratch_allocator

            dispatch.count("kernel")
            ensure_scratch_allocator()
            if valid is None:
                return fn(q, k, v)
            lens = _lengths(valid, q.shape[0])
            v8 = valid.view(torch.uint8) if valid.stride(-1) == 1 else \
                valid.contiguous().view(torch.uint8)
            return fn(q, k, v, lens, v8)
        dispatch.count("fallback")
        return cache_attention_torch(q, k, v, valid).contiguous()

    op = torch.library.custom_op(f"{NAMESPACE}::{CACHE_OP}", impl, mutates_args=(),
                                 schema="(Tensor q, Tensor k, Tensor v, Tensor? valid) -> Tensor")

    @op.register_fake
    def _(q: Any, k: Any, v: Any, valid: Optional[Any]) -> Any:
        return q.new_empty(q.shape)

    def setup(ctx: Any, inputs: tuple, output: Any) -> None:
        ctx.has_valid = inputs[3] is not None
        ctx.save_for_backward(*(t for t in inputs if t is not None))

    def backward(ctx: Any, grad: Any) -> tuple:
        saved = list(ctx.saved_tensors)
        q, k, v = (t.detach().requires_grad_(True) for t in saved[:3])
        with torch.enable_grad():
            out = cache_attention_torch(q, k, v, saved[3] if ctx.has_valid else None)
        gq, gk, gv = torch.autograd.grad(out, (q, k, v), grad)
        return gq, gk, gv, None

    op.register_autograd(backward, setup_context=setup)
    _ops[CACHE_OP] = op
    return op


#: families whose op could not be generated (name -> why); the tests require it to be empty
skipped: dict[str, str] = {}


def register_all() -> dict[str, Any]:
    """An op for every family in the registry plus the static-cache attention op. A family whose
    signature has no op schema is listed in `skipped` rather than breaking every other op."""
    from kernelsearch.families import NAMES

    for n in NAMES:
        try:
            register(n)
        except ValueError as e:
            skipped[n] = str(e)
    _register_cache_op()
    return dict(_ops)


register_all()
