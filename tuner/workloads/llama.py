"""The holistic inference workload: a Llama-style decoder in plain torch with random weights.

RMSNorm, rotary embeddings (half rotation), grouped-query attention over a static KV cache, SwiGLU
MLP. No downloads: weights are seeded random normals scaled 1/sqrt(fan_in), which keeps activations
O(1) so the plain-vs-dispatch comparison means something. Measures:

- prefill tokens/s: batch x context tokens through one causal forward (LM head on the last token);
- decode tokens/s: one new token per sequence with `ctx` tokens already in the cache, replayed
  as a CUDA graph on a GPU (what serving engines run) unless the candidate's runtime says not.

Hot ops go through `kernelsearch.dispatch` (docs/INTERNALS.md) so a kept kernel shows up end to
end; with no table installed (or no kernelsearch) every call is the plain torch op. `check()`
compares the dispatch path with the plain path on the same weights and inputs.

Runtime settings (Candidate.runtime) are in `Runtime`; unknown keys are refused (ValueError naming
the key). On a CPU there is no CUDA graph: `emulate_launch_us` charges a busy-wait per op launch
outside a "graph" and one per replay inside it, and `emulate_capture_us` a one-off capture cost,
which reproduces the GPU trade-off (graphs: slower to set up, much faster per step) for tests.

This module imports no pydantic (it runs on GPU machines whose Python lacks it); `LlamaWorkload`
builds `tuner.trial.Measurement` lazily.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Mapping, Optional, Sequence

from tuner.workloads.holistic import GridDefaults, HolisticWorkload, Presets, auto_device, size_grid
from tuner.workloads.llama_ops import Ops, apply_rope
from tuner.workloads.llama_runners import Bench, DecodeRunner, PrefillRunner, check
# where tests and benchmarks import them from (the model's module)
from tuner.workloads.holistic import SizeGrid, _sync, size_key  # noqa: F401
from tuner.workloads.llama_ops import load_dispatch, split_kv_attention  # noqa: F401
from tuner.workloads.llama_runners import (compiled, default_tolerance, rel_err,  # noqa: F401
                                           table_row)
from tuner.workloads.llama_runtime import Runtime

# -- configuration -----------------------------------------------------------------------------


@dataclass(frozen=True)
class LlamaConfig(Presets):  # .preset(name), .of(name | config | dict)
    dim: int = 4096
    n_layers: int = 4
    n_heads: int = 32
    n_kv_heads: int = 8
    ffn_dim: int = 14336
    vocab: int = 32000
    rope_theta: float = 500000.0
    norm_eps: float = 1e-5
    dtype: str = "bfloat16"

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    def validate(self) -> "LlamaConfig":
        if self.dim % self.n_heads or self.n_heads % self.n_kv_heads or self.head_dim % 2:
            raise ValueError(f"model: dim {self.dim} / heads {self.n_heads} / kv heads "
                             f"{self.n_kv_heads} must divide evenly with an even head dim")
        return self

    def params(self) -> int:
        hd = self.head_dim
        per_layer = (self.dim * hd * (2 * self.n_heads + 2 * self.n_kv_heads)
                     + 3 * self.dim * self.ffn_dim + 2 * self.dim)
        return self.n_layers * per_layer + 2 * self.vocab * self.dim + self.dim


PRESETS: dict[str, LlamaConfig] = {
    # CPU tests: a whole decode step in well under a millisecond of arithmetic
    "tiny": LlamaConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128, vocab=256,
                        dtype="float32"),
    # the shared facts' 4-layer Llama-3-8B-shaped decoder (d 4096, 32/8 heads, ffn 14336)
    "llama3-8b-4l": LlamaConfig(),
    "llama3-8b": LlamaConfig(n_layers=32, vocab=128256),
    "llama3-70b-4l": LlamaConfig(dim=8192, n_heads=64, n_kv_heads=8, ffn_dim=28672),
}
LlamaConfig.PRESETS = PRESETS


#: what a mixed search may change in the Llama workload (Runtime's fields, a few values each)
RUNTIME_DIMS: dict[str, list[Any]] = {
    "cuda_graphs": [True, False],
    "fuse_projections": [False, True],
    "attn_impl": ["sdpa", "split_kv"],
}


# -- the model ---------------------------------------------------------------------------------


class Llama:
    def __init__(self, cfg: LlamaConfig, device: str = "cpu", seed: int = 0):
        import torch

        self.cfg = cfg.validate()
        self.device = torch.device(device)
        self.dtype = getattr(torch, cfg.dtype)
        # drawn on the target device (seconds for GBs of weights on a GPU, not minutes)
        gen = torch.Generator(device=self.device).manual_seed(seed)

        def w(fan_in: int, *shape: int) -> Any:
            t = torch.randn(*shape, generator=gen, device=self.device, dtype=self.dtype)
            return t.mul_(1.0 / math.sqrt(fan_in))

        def linear(fan_in: int, fan_out: int) -> Any:
            # stored [out, in] as nn.Linear and checkpoints keep them, used as its [in, out]
            # transposed view (x @ W.t(), what F.linear computes): kernels see the serving layout
            return w(fan_in, fan_out, fan_in).t()

        def norm_w() -> Any:
            t = 1.0 + 0.1 * torch.randn(cfg.dim, generator=gen, device=self.device)
            return t.to(dtype=self.dtype)

        hd, d = cfg.head_dim, cfg.dim
        self.embed = w(1, cfg.vocab, d) * 0.5
        self.layers = []
        for _ in range(cfg.n_layers):
            self.layers.append({
                "attn_norm": norm_w(), "ffn_norm": norm_w(),
                "wq": linear(d, cfg.n_heads * hd), "wk": linear(d, cfg.n_kv_heads * hd),
                "wv": linear(d, cfg.n_kv_heads * hd), "wo": linear(cfg.n_heads * hd, d),
                "w_gate": linear(d, cfg.ffn_dim), "w_up": linear(d, cfg.ffn_dim),
                "w_down": linear(cfg.ffn_dim, d),
            })
        self.final_norm = norm_w()
        self.lm_head = linear(d, cfg.vocab)
        self._rope: Optional[tuple[Any, Any]] = None
        self._fused = False

    # fused projection weights, built once on demand (a runtime setting, same numbers)
    def ensure_fused(self) -> None:
        import torch

        if self._fused:
            return
        def fuse(*ws: Any) -> Any:  # concatenated along out, still the [out, in] storage
            return torch.cat([x.t() for x in ws], dim=0).t()

        for L in self.layers:
            L["wqkv"] = fuse(L["wq"], L["wk"], L["wv"])
            L["w_gu"] = fuse(L["w_gate"], L["w_up"])
        self._fused = True

    def rope(self, n: int) -> tuple[Any, Any]:
        """cos, sin tables (n, head_dim/2) in float32, grown on demand."""
        import torch

        if self._rope is None or self._rope[0].shape[0] < n:
            hd = self.cfg.head_dim
            inv = 1.0 / (self.cfg.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
            t = torch.arange(max(n, 64), dtype=torch.float64)
            ang = torch.outer(t, inv)
            self._rope = (ang.cos().float().to(self.device), ang.sin().float().to(self.device))
        return self._rope

    apply_rope = staticmethod(apply_rope)  # the op layer's rotation (tuner.workloads.llama_ops)

    def new_cache(self, batch: int, length: int, fill: str = "random", seed: int = 1) -> list[tuple[Any, Any]]:
        """Per-layer (k, v), each (B, Hkv, length, D). 'random' fills with N(0,1) values so decode
        timings at long contexts need no prefill (and never run on zeros)."""
        import torch

        c = self.cfg
        shape = (batch, c.n_kv_heads, length, c.head_dim)
        out = []
        gen = torch.Generator(device=self.device).manual_seed(seed)
        for _ in range(c.n_layers):
            if fill == "random":
                k = torch.randn(shape, generator=gen, device=self.device, dtype=self.dtype)
                v = torch.randn(shape, generator=gen, device=self.device, dtype=self.dtype)
            else:
                k = torch.zeros(shape, device=self.device, dtype=self.dtype)
                v = torch.zeros(shape, device=self.device, dtype=self.dtype)
            out.append((k, v))
        return out

    # -- forward passes ------------------------------------------------------------------------
    def reduce(self, partial: Any) -> Any:
        """The output of a row-parallel projection (attention's wo, the MLP's down): whole on
        one process; a tensor-parallel shard all-reduces it (tuner.workloads.tensor_parallel)."""
        return partial

    def _qkv(self, ops: Ops, L: dict[str, Any], h: Any) -> tuple[Any, Any, Any]:
        c = self.cfg
        nq, nk = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
        if ops.rt.fuse_projections:
            self.ensure_fused()
            qkv = ops.matmul(h, L["wqkv"])
            return qkv[:, :nq], qkv[:, nq:nq + nk], qkv[:, nq + nk:]
        return ops.matmul(h, L["wq"]), ops.matmul(h, L["wk"]), ops.matmul(h, L["wv"])

    def _mlp(self, ops: Ops, L: dict[str, Any], h: Any) -> Any:
        # gate|up fused only for decode-sized inputs (at a long prefill the strided halves would
        # cost a kernel that needs them contiguous a gigabyte-sized copy). The halves go in as
        # strided views: swiglu/rows reads them in place, the others copy what they need.
        if ops.rt.fuse_projections and h.shape[0] <= 64:
            self.ensure_fused()
            gu = ops.matmul(h, L["w_gu"])
            f = self.cfg.ffn_dim
            return ops.matmul(ops.swiglu(gu[:, :f], gu[:, f:]), L["w_down"])
        return ops.matmul(ops.swiglu(ops.matmul(h, L["w_gate"]), ops.matmul(h, L["w_up"])), L["w_down"])

    def decode_step(self, ops: Ops, tokens: Any, pos: Any, cache: list[tuple[Any, Any]]) -> Any:
        """One token per sequence at position `pos` (the cache holds positions < pos); writes
        this token's K/V at `pos` and returns logits (B, vocab) in float32.

        `pos` is an int (attention over cache[:, :, :pos + 1]) or, as serving engines pass it, a
        one-element device tensor (attention over the whole cache, whose length must then be
        pos + 1): no Python value to specialise on, so one compiled step serves every context
        length and a CUDA graph captures no constant position."""
        c = self.cfg
        B, hd = tokens.shape[0], c.head_dim
        if isinstance(pos, int):
            cos, sin = self.rope(pos + 1)
            cos, sin = cos[pos:pos + 1], sin[pos:pos + 1]
        else:
            assert self._rope is not None, "build the rotary table first: model.rope(max_len)"
            cos, sin = self._rope[0].index_select(0, pos), self._rope[1].index_select(0, pos)
        ops.elementwise()
        x = self.embed[tokens]  # (B, d)
        for L, (kc, vc) in zip(self.layers, cache):
            h = ops.rmsnorm(x, L["attn_norm"], c.norm_eps)
            if ops.rt.fuse_projections:
                # q and k heads sit side by side in the fused output: rotate both in one op
                # (one kernel launch with a rope table entry, instead of ~16 glue kernels)
                self.ensure_fused()
                qkv = ops.matmul(h, L["wqkv"])
                nh = c.n_heads + c.n_kv_heads
                qk = ops.rope(qkv[:, :nh * hd].view(B, nh, hd), cos, sin)
                q, k = qk[:, :c.n_heads].unsqueeze(2), qk[:, c.n_heads:].unsqueeze(2)
                v = qkv[:, nh * hd:].view(B, c.n_kv_heads, 1, hd)
            else:
                q, k, v = self._qkv(ops, L, h)
                q = self.apply_rope(q.reshape(B, c.n_heads, 1, hd), cos, sin)
                k = self.apply_rope(k.reshape(B, c.n_kv_heads, 1, hd), cos, sin)
                v = v.reshape(B, c.n_kv_heads, 1, hd)
                ops.elementwise(2)
            if isinstance(pos, int):
                kc[:, :, pos:pos + 1].copy_(k)
                vc[:, :, pos:pos + 1].copy_(v)
                ks, vs = kc[:, :, :pos + 1], vc[:, :, :pos + 1]
            else:
                kc.index_copy_(2, pos, k)
                vc.index_copy_(2, pos, v)
                ks, vs = kc, vc
            ops.elementwise(2)
            a = ops.decode_attention(q, ks, vs)
            x = x + self.reduce(ops.matmul(a.reshape(B, c.n_heads * hd), L["wo"]))
            h = ops.rmsnorm(x, L["ffn_norm"], c.norm_eps)
            x = x + self.reduce(self._mlp(ops, L, h))
            ops.elementwise(2)
        x = ops.rmsnorm(x, self.final_norm, c.norm_eps)
        return ops.matmul(x, self.lm_head).float()

    def prefill(self, ops: Ops, tokens: Any, cache: Optional[list[tuple[Any, Any]]] = None) -> Any:
        """Causal forward over tokens (B, S); fills cache[:, :, :S] when given; returns the last
        position's logits (B, vocab) in float32."""
        c = self.cfg
        B, S = tokens.shape
        hd = c.head_dim
        cos, sin = self.rope(S) if self._rope is None else self._rope  # grown beforehand
        cos, sin = cos[:S], sin[:S]
        ops.elementwise()
        x = self.embed[tokens].reshape(B * S, c.dim)
        for i, L in enumerate(self.layers):
            h = ops.rmsnorm(x, L["attn_norm"], c.norm_eps)
            q, k, v = self._qkv(ops, L, h)
            q = self.apply_rope(q.reshape(B, S, c.n_heads, hd).transpose(1, 2), cos, sin)
            k = self.apply_rope(k.reshape(B, S, c.n_kv_heads, hd).transpose(1, 2), cos, sin)
            v = v.reshape(B, S, c.n_kv_heads, hd).transpose(1, 2)
            ops.elementwise(2)
            if cache is not None:
                cache[i][0][:, :, :S].copy_(k)
                cache[i][1][:, :, :S].copy_(v)
                ops.elementwise(2)
            a = ops.prefill_attention(q, k, v)  # (B, Hq, S, D)
            x = x + self.reduce(ops.matmul(a.transpose(1, 2).reshape(B * S, c.n_heads * hd), L["wo"]))
            h = ops.rmsnorm(x, L["ffn_norm"], c.norm_eps)
            x = x + self.reduce(self._mlp(ops, L, h))
            ops.elementwise(2)
        last = x.reshape(B, S, c.dim)[:, -1].contiguous()
        last = ops.rmsnorm(last, self.final_norm, c.norm_eps)
        return ops.matmul(last, self.lm_head).float()


# -- the Workload ------------------------------------------------------------------------------


class LlamaWorkload(HolisticWorkload):
    """The holistic workload (tuner.workloads.base.Workload): tokens/s geometric mean over
    prefill and decode sizes, with per-size results. `configure(runtime)` sets the candidate's
    runtime; `measure` checks outputs against the plain path once per runtime (a mismatch
    raises WorkloadFailed) and then times (tuner.workloads.holistic: a failure of the run is
    WorkloadFailed too). A subclass over another model with this interface states its
    `Config`, `Model`, grid defaults and `PREFILL` (tuner.workloads.deepseek)."""

    name = "llama"
    Runtime = Runtime
    RUNTIME_DIMS = RUNTIME_DIMS
    Config: Any = LlamaConfig
    Model: Any = Llama
    CPU_GRID = GridDefaults(contexts=(16, 64), decode_batch=2, decode_steps=5)
    GPU_GRID = GridDefaults(contexts=(4096, 16384, 65536, 131072), decode_batch=8, decode_steps=20)
    PREFILL = True  # prefill sizes measured where the caller does not say

    def __init__(self, model: Any = "tiny", contexts: Optional[Sequence[int]] = None,
                 decode_batches: Optional[Sequence[int]] = None,
                 prefill_batches: Optional[Sequence[int]] = None,
                 decode_steps: Optional[int] = None, device: Optional[str] = None, seed: int = 0,
                 runtime: Optional[Mapping[str, Any]] = None, prefill: Optional[bool] = None,
                 decode: bool = True, check_outputs: bool = True):
        """`model`: a preset name, a config (self.Config) or a dict of its fields."""
        cfg = self.Config.of(model)
        dev = device or auto_device()
        self.grid = size_grid(self.CPU_GRID, self.GPU_GRID, dev, contexts, decode_batches,
                              prefill_batches, decode_steps,
                              self.PREFILL if prefill is None else prefill, decode)
        self.model = self.Model(cfg, dev, seed)
        self.dispatch = load_dispatch()
        self.bench = Bench(self.model, self.grid, self.dispatch)
        self._start(runtime, check_outputs)

    def _check_now(self) -> dict[str, Any]:
        return check(self.model, self.runtime, self.dispatch)

    def _first_runner(self, kind: str, batch: int, ctx: int) -> Any:
        cls = DecodeRunner if kind == "decode" else PrefillRunner
        return cls(self.model, self.runtime, batch, ctx, dispatch=self.dispatch)

    def _compiles(self) -> bool:
        return bool(self.runtime.compile_mode)

    def _extra(self) -> dict[str, Any]:
        return {"model": asdict(self.model.cfg), "device": str(self.model.device)}


def from_spec(spec: Any) -> LlamaWorkload:
    """`--workload llama` (tuner.workloads.factory): no arguments."""
    return LlamaWorkload()
