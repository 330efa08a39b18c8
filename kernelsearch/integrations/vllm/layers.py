"""vLLM's RMSNorm and SiluAndMul on metaltune's custom ops, as out-of-tree CustomOp classes
(`CustomOp.register_oot`: vLLM instantiates the registered subclass wherever a model builds the
in-tree layer), and metaltune as a `vllm.ir` provider for rms_norm and fused_add_rms_norm.

Each forward calls `torch.ops.metaltune.<family>` (kernelsearch.ops), whose implementation is
`dispatch.call`: the installed table's kernel inside its certified range (with the canary),
the library or torch outside it. The forwards override `forward_native`, which every route of
these layers ends in (vLLM's enabled CPU/CUDA forwards for RMSNorm call it; a disabled custom op
runs it, compiled), and SiluAndMul's CUDA/CPU/XPU forwards (they call vLLM's C++ op otherwise).
Under torch.compile the ops are opaque custom ops with fake implementations: no graph break.

Only what the family computes goes through metaltune: an RMSNorm whose hidden size and dtype
the table has no entry for (checked once, when the model is built, as the HF integration does),
a weightless norm, a variance over part of the hidden size, or activations in another dtype than
the weight run vLLM's own forward. SiluAndMul always goes through metaltune's op (its size is
known only per call; the op's fallback, F.silu(gate) * up, is vLLM's own expression).
Fused add: the sum is taken in float32 and rounded to the activations' dtype (the residual
vLLM passes on), then normalised by metaltune's rmsnorm. vLLM's native op normalises the
unrounded float32 sum; in float32 the two are the same, in bf16/fp16 they can differ in the
last bit (docs/vllm-plugin.md)."""
# no `from __future__ import annotations`: vllm.ir infers the op schema from these functions'
# annotations, which must be objects, not strings naming locals
import logging
from typing import Any, Optional

import torch
from vllm.model_executor.custom_op import op_registry_oot
from vllm.model_executor.layers.activation import SiluAndMul
from vllm.model_executor.layers.layernorm import RMSNorm

import kernelsearch.ops  # noqa: F401  (defines torch.ops.metaltune.*)

log = logging.getLogger("vllm.metaltune")
PROVIDER = "metaltune"  # the vllm.ir provider name: --kernel-config ir_op_priority lists it


def _ours(x: Any, weight: Optional[Any], variance_size: Optional[int]) -> bool:
    return weight is not None and variance_size is None and x.dtype == weight.dtype


def _add_norm(x: Any, residual: Any, weight: Any, eps: float) -> tuple[Any, Any]:
    res = (x.float() + residual.float()).to(x.dtype)
    return torch.ops.metaltune.rmsnorm(res, weight, eps), res


_planned: set = set()


def log_plan(family: str, match: dict, dtype: Any) -> None:
    """Say once per (family, dims, dtype) what each CUDA graph vLLM will capture pins
    (graphs.capture_plan over compilation_config.cudagraph_capture_sizes); nothing without
    graphs (the CPU build, --enforce-eager) or a table."""
    from vllm.config import get_current_vllm_config

    from kernelsearch import dispatch
    from kernelsearch.families.base import dtype_name
    from kernelsearch.integrations.vllm import graphs

    key = (family, tuple(sorted(match.items())), str(dtype))
    tbl = dispatch.installed()
    if key in _planned or tbl is None:
        return
    sizes = get_current_vllm_config().compilation_config.cudagraph_capture_sizes or []
    if sizes:
        _planned.add(key)
        plan = graphs.capture_plan(tbl, family, dtype_name(dtype), match, sizes)
        log.info("metaltune: CUDA graphs pin %s %s %s per captured batch size: %s", family,
                 match, dtype_name(dtype), graphs.summary(plan))


def covered(family: str, match: dict, dtype: Any) -> bool:
    """Whether the installed table has an entry for these exact dims and dtype (as the HF
    integration's `coverage`): a layer it does not cover keeps vLLM's own forward, bit for bit."""
    from kernelsearch import dispatch
    from kernelsearch.families.base import dtype_name

    tbl = dispatch.installed()
    return tbl is not None and any(e.family == family and e.dtype == dtype_name(dtype)
                                   and e.match == match for e in tbl.entries)


class MetaltuneRMSNorm(RMSNorm):
    """RMSNorm (and its fused residual add) through metaltune::rmsnorm, where the table has an
    entry at this layer's hidden size and dtype."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.metaltune = covered("rmsnorm", {"cols": self.hidden_size}, self.weight.dtype)
        if self.metaltune:
            log_plan("rmsnorm", {"cols": self.hidden_size}, self.weight.dtype)

    def forward_native(self, x: torch.Tensor, residual: Optional[torch.Tensor] = None) -> Any:
        w = self.weight.data if self.pass_weight else None
        if not (self.metaltune and _ours(x, w, self.variance_size_override)):
            return super().forward_native(x, residual)
        if residual is None:
            return torch.ops.metaltune.rmsnorm(x, w, self.variance_epsilon)
        return _add_norm(x, residual, w, self.variance_epsilon)


class MetaltuneSiluAndMul(SiluAndMul):
    """silu(x[..., :d]) * x[..., d:] through metaltune::swiglu (vLLM's CUDA/XPU forwards call
    its C++ op: replaced too)."""

    def forward_native(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        d = x.shape[-1] // 2
        return torch.ops.metaltune.swiglu(x[..., :d], x[..., d:])

    forward_cuda = forward_cpu = forward_xpu = forward_native


def register_layers() -> list[str]:
    """Register the out-of-tree layers (once per process); returns the in-tree names replaced."""
    out = []
    for base, ours in ((RMSNorm, MetaltuneRMSNorm), (SiluAndMul, MetaltuneSiluAndMul)):
        cur = op_registry_oot.get(base.__name__)
        if cur is None:
            base.register_oot(ours)
        elif cur is not ours:  # another plugin's: vLLM keeps one per layer, so theirs stays
            log.warning("metaltune: %s is already replaced by %s.%s: left to it",
                        base.__name__, cur.__module__, cur.__qualname__)
            continue
        out.append(base.__name__)
    return out


def register_ir() -> list[str]:
    """metaltune as a provider of vLLM's IR ops rms_norm and fused_add_rms_norm (once per
    process). vLLM runs a provider only where `ir_op_priority` lists it (its rule: no enabling
    from the environment), e.g. `--kernel-config '{"ir_op_priority": {"rms_norm":
    ["metaltune", "native"]}}'`; `supports_args` hands what the family does not compute to the
    next provider."""
    from torch import Tensor
    from vllm import ir

    out = []
    rms, fused = ir.ops.rms_norm, ir.ops.fused_add_rms_norm
    if PROVIDER not in rms.impls:
        def rms_supports(x: Tensor, weight: Tensor | None, epsilon: float,
                         variance_size: int | None = None) -> bool:
            return _ours(x, weight, variance_size)

        @rms.register_impl(PROVIDER, supports_args=rms_supports)
        def rms_norm(x: Tensor, weight: Tensor | None, epsilon: float,
                     variance_size: int | None = None) -> Tensor:
            return torch.ops.metaltune.rmsnorm(x, weight, epsilon)
    out.append("rms_norm")
    if PROVIDER not in fused.impls:
        def fused_supports(x: Tensor, x_residual: Tensor, weight: Tensor | None, epsilon: float,
                           variance_size: int | None = None) -> bool:
            return _ours(x, weight, variance_size) and x_residual.dtype == x.dtype

        @fused.register_impl(PROVIDER, supports_args=fused_supports)
        def fused_add_rms_norm(x: Tensor, x_residual: Tensor, weight: Tensor | None,
                               epsilon: float, variance_size: int | None = None
                               ) -> tuple[Tensor, Tensor]:
            return _add_norm(x, x_residual, weight, epsilon)
    out.append("fused_add_rms_norm")
    return out


MLA_CLASS = "kernelsearch.integrations.vllm.mla.MetaltuneMLABackend"


def register_mla() -> list[str]:
    """metaltune's MLA decode as vLLM's CUSTOM attention backend (kernelsearch.integrations.vllm
    .mla), by class path: vLLM imports it only when `--attention-backend CUSTOM` picks it.
    Nothing where another plugin holds CUSTOM already (theirs stays)."""
    from vllm.v1.attention.backends import registry

    cur = registry._ATTN_OVERRIDES.get(registry.AttentionBackendEnum.CUSTOM)
    if cur not in (None, MLA_CLASS):
        log.warning("metaltune: the CUSTOM attention backend is already %s: left to it", cur)
        return []
    registry.register_backend(registry.AttentionBackendEnum.CUSTOM, MLA_CLASS)
    return ["attention backend CUSTOM (MLA)"]
