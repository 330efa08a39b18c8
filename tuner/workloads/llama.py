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
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Mapping, Optional, Sequence

from tuner.workloads.holistic import (GridDefaults, HolisticWorkload, Presets, RuntimeSettings,
                                      SizeGrid, _sync, _Timer, auto_device, size_grid,
                                      time_sizes)
from tuner.workloads.holistic import size_key  # noqa: F401 - where benchmarks import it from
from tuner.workloads.stats import geomean, rel_spread

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


@dataclass
class Runtime(RuntimeSettings):
    """A candidate's runtime settings (Candidate.runtime)."""

    cuda_graphs: bool = True
    # batch sizes captured as graphs (vLLM's cudagraph_capture_sizes); None: every batch
    graph_capture_sizes: Optional[list[int]] = None
    # contexts above this run eagerly (vLLM's max_seq_len_to_capture); None: no limit
    max_ctx_to_capture: Optional[int] = None
    use_dispatch: bool = True  # route hot ops through kernelsearch.dispatch
    attn_impl: str = "sdpa"  # "sdpa" | "split_kv" (flash-decoding style, kv_split per chunk)
    kv_split: int = 256
    fuse_projections: bool = False  # one QKV matmul (and gate|up at decode sizes)
    compile_mode: Optional[str] = None  # torch.compile mode, e.g. "max-autotune" (benchmarks)
    emulate_launch_us: float = 0.0  # CPU only, see the module docstring
    emulate_capture_us: float = 0.0

    @classmethod
    def from_dict(cls, d: Optional[Mapping[str, Any]]) -> "Runtime":
        rt = cls(**cls.known(d))
        if rt.attn_impl not in ("sdpa", "split_kv"):
            raise ValueError(f"runtime.attn_impl: expected 'sdpa' or 'split_kv', got {rt.attn_impl!r}")
        if int(rt.kv_split) < 1:
            raise ValueError(f"runtime.kv_split: expected a positive integer, got {rt.kv_split!r}")
        return rt

    def inductor_graphs(self) -> bool:
        """torch.compile modes that capture their own CUDA graphs (cudagraph trees)."""
        return self.compile_mode in ("reduce-overhead", "max-autotune")

    def graphs_for(self, batch: int, ctx: int) -> bool:
        """Whether this runner captures the decode step as a CUDA graph itself (a compiled
        step without inductor's own graphs is captured like an eager one, as vLLM does)."""
        if not self.cuda_graphs or self.inductor_graphs():
            return False
        if self.graph_capture_sizes is not None and batch not in self.graph_capture_sizes:
            return False
        return self.max_ctx_to_capture is None or ctx <= self.max_ctx_to_capture


# -- the op layer: dispatch or plain torch -----------------------------------------------------


#: what a mixed search may change in the Llama workload (Runtime's fields, a few values each)
RUNTIME_DIMS: dict[str, list[Any]] = {
    "cuda_graphs": [True, False],
    "fuse_projections": [False, True],
    "attn_impl": ["sdpa", "split_kv"],
}


def load_dispatch() -> Any:
    """kernelsearch.dispatch, or None while it does not exist (thin guard, see the issue)."""
    try:
        from kernelsearch import dispatch  # type: ignore[import-not-found]
    except ImportError:
        return None
    return dispatch if hasattr(dispatch, "call") else None


def _spin(us: float) -> None:
    end = time.perf_counter() + us * 1e-6
    while time.perf_counter() < end:
        pass


class Ops:
    """The model's hot operations. Each goes through `kernelsearch.dispatch.call(family, ...)`
    when dispatch is on; a family the dispatcher does not know falls back to the plain op."""

    def __init__(self, runtime: Runtime, dispatch: Any = None):
        self.rt = runtime
        self.dispatch = dispatch if runtime.use_dispatch else None
        self._missing: set[str] = set()
        self.in_graph = False  # CPU emulation: launches inside a "graph" cost nothing extra

    def _launch(self) -> None:
        if self.rt.emulate_launch_us and not self.in_graph:
            _spin(self.rt.emulate_launch_us)

    def _call(self, family: str, plain: Callable[..., Any], *args: Any) -> Any:
        self._launch()
        if self.dispatch is not None and family not in self._missing:
            try:
                return self.dispatch.call(family, *args)
            except (KeyError, NotImplementedError, AttributeError, LookupError):
                self._missing.add(family)  # this dispatcher has no such family
        return plain(*args)

    # plain torch versions, as the Llama reference code writes them
    @staticmethod
    def plain_rmsnorm(x: Any, weight: Any, eps: float) -> Any:
        import torch

        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).type_as(x) * weight

    @staticmethod
    def plain_swiglu(gate: Any, up: Any) -> Any:
        import torch.nn.functional as F

        return F.silu(gate) * up

    @staticmethod
    def plain_matmul(a: Any, b: Any) -> Any:
        return a @ b

    @staticmethod
    def plain_rope(x: Any, cos: Any, sin: Any) -> Any:
        """x (B, NH, D), the q and k heads of one token; cos/sin (B or 1, D/2): Llama.apply_rope's
        ops, so the result is bit-identical to rotating q and k separately."""
        return Llama.apply_rope(x, cos.unsqueeze(-2), sin.unsqueeze(-2))

    @staticmethod
    def plain_decode_attention(q: Any, k: Any, v: Any) -> Any:
        """q (B, Hq, 1, D); k, v (B, Hkv, L, D) -> (B, Hq, 1, D)."""
        import torch.nn.functional as F

        return F.scaled_dot_product_attention(q, k, v, enable_gqa=q.shape[1] != k.shape[1])

    @staticmethod
    def plain_mla_decode(q: Any, kv_cache: Any, block_table: Any, seq_lens: Any,
                         scale: float) -> Any:
        """Absorbed MLA decode as plain torch writes it (the family's torch path: gather the
        pages, bmm, float softmax, bmm), so a fallback call is bit-identical to it."""
        from kernelsearch.families import get

        return get("mla_decode").torch_default(q, kv_cache, block_table, seq_lens, scale)

    @staticmethod
    def plain_mla_sparse_decode(q: Any, kv_cache: Any, block_table: Any, seq_lens: Any,
                                indices: Any, scale: float) -> Any:
        from kernelsearch.families import get

        return get("mla_sparse_decode").torch_default(q, kv_cache, block_table, seq_lens,
                                                      indices, scale)

    def rmsnorm(self, x: Any, w: Any, eps: float) -> Any:
        return self._call("rmsnorm", self.plain_rmsnorm, x, w, eps)

    def swiglu(self, g: Any, u: Any) -> Any:
        return self._call("swiglu", self.plain_swiglu, g, u)

    def matmul(self, a: Any, b: Any) -> Any:
        return self._call("matmul", self.plain_matmul, a, b)

    def rope(self, x: Any, cos: Any, sin: Any) -> Any:
        return self._call("rope", self.plain_rope, x, cos, sin)

    def decode_attention(self, q: Any, k: Any, v: Any) -> Any:
        if self.rt.attn_impl == "split_kv":
            return split_kv_attention(q, k, v, int(self.rt.kv_split), self._launch)
        if self.dispatch is not None and "decode_attention" not in self._missing:
            # the family's layout: q [B, Hq, D] -> [B, Hq, D]
            return self._call("decode_attention", lambda q3, k, v: self.plain_decode_attention(
                q3.unsqueeze(2), k, v).squeeze(2), q.squeeze(2), k, v).unsqueeze(2)
        return self._call("decode_attention", self.plain_decode_attention, q, k, v)

    def mla_decode(self, q: Any, kv_cache: Any, block_table: Any, seq_lens: Any,
                   scale: float) -> Any:
        return self._call("mla_decode", self.plain_mla_decode, q, kv_cache, block_table,
                          seq_lens, scale)

    def mla_sparse_decode(self, q: Any, kv_cache: Any, block_table: Any, seq_lens: Any,
                          indices: Any, scale: float) -> Any:
        return self._call("mla_sparse_decode", self.plain_mla_sparse_decode, q, kv_cache,
                          block_table, seq_lens, indices, scale)

    def prefill_attention(self, q: Any, k: Any, v: Any) -> Any:
        import torch.nn.functional as F

        self._launch()
        return F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                              enable_gqa=q.shape[1] != k.shape[1])

    def elementwise(self, n: int = 1) -> None:
        """Account for plain elementwise launches (rotary, residual adds, cache writes)."""
        for _ in range(n):
            self._launch()


def split_kv_attention(q: Any, k: Any, v: Any, split: int, launch: Callable[[], None]) -> Any:
    """Flash-decoding: attend to each `split`-long chunk of the cache, then merge the partial
    results with their log-sum-exp. Exact; cheap with few chunks, many launches with many."""
    import torch

    B, Hq, _, D = q.shape
    Hkv, L = k.shape[1], k.shape[2]
    g = Hq // Hkv
    qg = q.reshape(B, Hkv, g, D).float() * (1.0 / math.sqrt(D))
    outs, lses = [], []
    for s in range(0, L, split):
        launch()
        kc = k[:, :, s:s + split].float()
        vc = v[:, :, s:s + split].float()
        sc = qg @ kc.transpose(-1, -2)  # (B, Hkv, g, c)
        lse = torch.logsumexp(sc, dim=-1, keepdim=True)
        outs.append(torch.exp(sc - lse) @ vc)
        lses.append(lse)
    launch()
    lse_all = torch.stack(lses)  # (n, B, Hkv, g, 1)
    w = torch.softmax(lse_all, dim=0)
    out = (torch.stack(outs) * w).sum(0)
    return out.reshape(B, Hq, 1, D).to(q.dtype)


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

    @staticmethod
    def apply_rope(x: Any, cos: Any, sin: Any) -> Any:
        """x (B, H, S, D); cos/sin (S, D/2): rotate (first half, second half) pairs."""
        import torch

        h = x.shape[-1] // 2
        xf = x.float()
        x1, x2 = xf[..., :h], xf[..., h:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).type_as(x)

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


# -- runners: one (kind, batch, ctx) under one runtime -----------------------------------------


_COMPILED: dict[tuple[int, str, str], Callable[..., Any]] = {}


def compiled(model: Llama, runtime: Runtime, kind: str, dispatch: Any = None) -> Callable[..., Any]:
    """One torch.compile'd step per (model, runtime, kind), shared by every size: the first
    size compiles it, the second recompiles it with dynamic shapes (dynamo's automatic dynamic),
    later sizes reuse that. Each call starts a new cudagraph-tree step."""
    import torch

    key = (id(model), runtime.key(), kind)
    if key not in _COMPILED:
        _allow_recompiles()
        ops = Ops(runtime, dispatch)
        if kind == "decode":
            def body(t: Any, p: Any, c: Any) -> Any:
                return model.decode_step(ops, t, p, c)
        else:
            def body(t: Any, c: Any) -> Any:  # type: ignore[misc]
                return model.prefill(ops, t, c)
        fn = torch.compile(body, mode=runtime.compile_mode)

        if runtime.inductor_graphs():
            def step(*args: Any) -> Any:
                torch.compiler.cudagraph_mark_step_begin()
                return fn(*args)
        else:
            step = fn

        _COMPILED[key] = step
    return _COMPILED[key]


def _allow_recompiles(n: int = 64) -> None:
    import torch

    cfg = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(cfg, name):
            setattr(cfg, name, max(n, getattr(cfg, name)))


def _dynamic_len(cache: list[tuple[Any, Any]]) -> None:
    import torch

    for k, v in cache:
        torch._dynamo.maybe_mark_dynamic(k, 2)  # no error if a kernel choice specialises it
        torch._dynamo.maybe_mark_dynamic(v, 2)


def _static(cache: list[tuple[Any, Any]]) -> None:
    import torch

    for k, v in cache:
        torch._dynamo.mark_static_address(k)
        torch._dynamo.mark_static_address(v)


class DecodeRunner:
    """A decode step at context `ctx` for `batch` sequences, ready to replay.

    Prepare once (cache, warm-up, graph capture or compile); `step()` runs one token per sequence.
    Each step rewrites the same cache slot, so timings are steady and memory stays fixed."""

    def __init__(self, model: Llama, runtime: Runtime, batch: int, ctx: int,
                 cache: Optional[list[tuple[Any, Any]]] = None, dispatch: Any = None, seed: int = 0):
        import torch

        self.model, self.rt, self.batch, self.ctx = model, runtime, batch, ctx
        self.ops = Ops(runtime, dispatch)
        self.cache = cache if cache is not None else model.new_cache(batch, ctx + 1)
        g = torch.Generator(device="cpu").manual_seed(seed)
        self.tokens = torch.randint(0, model.cfg.vocab, (batch,), generator=g).to(model.device)
        # a model with its own cache type (tuner.workloads.deepseek's paged one) says its length
        length = (model.cache_len(self.cache) if hasattr(model, "cache_len")
                  else self.cache[0][0].shape[2])
        if length != ctx + 1:
            raise ValueError(f"decode runner: cache length {length} != ctx + 1")
        model.rope(ctx + 1)
        self.pos = torch.tensor([ctx], device=model.device)
        self.graph: Any = None
        self.out: Any = None
        self.graphed = runtime.graphs_for(batch, ctx)
        self.setup_s = 0.0
        if runtime.compile_mode:
            if runtime.inductor_graphs():
                _static(self.cache)  # written in place: static addresses keep cudagraphs on
            else:  # one compiled step for every context length: no recompile per size
                _dynamic_len(self.cache)
            fn = compiled(model, runtime, "decode", dispatch)
            self._fn: Callable[[], Any] = lambda: fn(self.tokens, self.pos, self.cache)
        else:
            self._fn = lambda: model.decode_step(self.ops, self.tokens, self.pos, self.cache)

    def prepare(self, warmup: int = 2) -> "DecodeRunner":
        t0 = time.perf_counter()
        dev = self.model.device
        if self.graphed and dev.type == "cuda":
            from tuner.workloads.graphs import capture

            self.graph, self.out = capture(self._fn, warmup, dev)
        else:
            if self.rt.compile_mode:  # compile, then cudagraph-tree warm-up and recording
                warmup = max(warmup, 3)
            for _ in range(max(1, warmup)):
                self.out = self._fn()
            if self.graphed:  # CPU emulation of a capture
                _spin(self.rt.emulate_capture_us)
        _sync(dev)
        self.setup_s = time.perf_counter() - t0
        return self

    def step(self) -> Any:
        if self.graph is not None:
            self.graph.replay()
            return self.out
        if self.graphed:  # CPU emulation: one launch for the whole replay
            self.ops.in_graph = False
            self.ops._launch()
            self.ops.in_graph = True
            try:
                self.out = self._fn()
            finally:
                self.ops.in_graph = False
            return self.out
        self.out = self._fn()
        return self.out

    def tokens_per_s(self, steps: int) -> float:
        t = _Timer(self.model.device)(self.step, steps)
        return self.batch * steps / t


class PrefillRunner:
    def __init__(self, model: Llama, runtime: Runtime, batch: int, ctx: int,
                 cache: Optional[list[tuple[Any, Any]]] = None, dispatch: Any = None, seed: int = 0):
        import torch

        self.model, self.rt, self.batch, self.ctx = model, runtime, batch, ctx
        self.ops = Ops(runtime, dispatch)
        self.cache = cache if cache is not None else model.new_cache(batch, ctx)
        g = torch.Generator(device="cpu").manual_seed(seed)
        self.tokens = torch.randint(0, model.cfg.vocab, (batch, ctx), generator=g).to(model.device)
        if runtime.compile_mode:
            _static(self.cache)
            fn = compiled(model, runtime, "prefill", dispatch)
            self._fn: Callable[[], Any] = lambda: fn(self.tokens, self.cache)
        else:
            self._fn = lambda: model.prefill(self.ops, self.tokens, self.cache)
        self.setup_s = 0.0

    def prepare(self, warmup: int = 1) -> "PrefillRunner":
        t0 = time.perf_counter()
        if self.rt.compile_mode:  # compile, then cudagraph-tree warm-up and recording
            warmup = max(warmup, 3)
        for _ in range(max(1, warmup)):
            self._fn()
        _sync(self.model.device)
        self.setup_s = time.perf_counter() - t0
        return self

    def step(self) -> Any:
        return self._fn()

    def tokens_per_s(self, steps: int = 1) -> float:
        t = _Timer(self.model.device)(self.step, steps)
        return self.batch * self.ctx * steps / t


# -- correctness -------------------------------------------------------------------------------


def rel_err(a: Any, b: Any) -> float:
    """‖a − b‖ / ‖b‖ in float64 (NaN anywhere → inf)."""
    import torch

    a64, b64 = a.double(), b.double()
    if not torch.isfinite(a64).all():
        return math.inf
    den = b64.norm().item()
    return (a64 - b64).norm().item() / den if den else (a64 - b64).norm().item()


def default_tolerance(dtype: str) -> float:
    return 2e-2 if dtype in ("bfloat16", "float16") else 1e-4


def check(model: Llama, runtime: Runtime, dispatch: Any = None, batch: int = 2, ctx: int = 64,
          tol: Optional[float] = None, seed: int = 3) -> dict[str, Any]:
    """Outputs of the candidate path (dispatch + runtime settings) against the plain torch path
    (no dispatch, plain attention, unfused) on the same weights and fresh random inputs:
    prefill logits and one decode step after it. Returns errors; `ok` False beyond `tol`."""
    import torch

    tol = default_tolerance(model.cfg.dtype) if tol is None else tol
    plain = Ops(Runtime(use_dispatch=False))
    cand = Ops(runtime, dispatch)
    g = torch.Generator(device="cpu").manual_seed(seed)
    toks = torch.randint(0, model.cfg.vocab, (batch, ctx + 1), generator=g).to(model.device)
    errs = {}
    with torch.no_grad():
        c_ref = model.new_cache(batch, ctx + 1, fill="zeros")
        c_new = model.new_cache(batch, ctx + 1, fill="zeros")
        ref_p = model.prefill(plain, toks[:, :ctx], c_ref)
        new_p = model.prefill(cand, toks[:, :ctx], c_new)
        errs["prefill"] = rel_err(new_p, ref_p)
        ref_d = model.decode_step(plain, toks[:, ctx], ctx, c_ref)
        new_d = model.decode_step(cand, toks[:, ctx], ctx, c_new)
        errs["decode"] = rel_err(new_d, ref_d)
    worst = max(errs.values())
    return {"ok": worst <= tol, "tol": tol, "errors": errs,
            "dispatch": dispatch is not None and runtime.use_dispatch}


# -- a whole table -----------------------------------------------------------------------------


class Bench:
    """Prefill and decode tokens/s over a size grid for one model, runtime by runtime.

    KV caches are shared between runtimes (keyed by batch and length) and runners (graphs,
    compiled functions) are kept per runtime, so A/B alternation re-captures nothing."""

    def __init__(self, model: Llama, grid: SizeGrid, dispatch: Any = None):
        self.model, self.grid, self.dispatch = model, grid, dispatch
        self._caches: dict[tuple[str, int, int], list[tuple[Any, Any]]] = {}
        self._runners: dict[tuple[str, str, int, int], Any] = {}
        self.at: Optional[str] = None  # the size being prepared or timed (time_sizes)

    def _cache(self, kind: str, batch: int, length: int) -> list[tuple[Any, Any]]:
        k = (kind, batch, length)
        if k not in self._caches:
            self._caches[k] = self.model.new_cache(batch, length)
        return self._caches[k]

    def runner(self, rt: Runtime, kind: str, batch: int, ctx: int) -> Any:
        k = (rt.key(), kind, batch, ctx)
        if k not in self._runners:
            if kind == "decode":
                r: Any = DecodeRunner(self.model, rt, batch, ctx, self._cache(kind, batch, ctx + 1),
                                      self.dispatch)
            else:
                r = PrefillRunner(self.model, rt, batch, ctx, self._cache(kind, batch, ctx),
                                  self.dispatch)
            r.prepare()
            self._runners[k] = r
        return self._runners[k]

    def drop(self, rt: Optional[Runtime] = None) -> None:
        """Free runners (and their graphs) of one runtime, or all of them."""
        if rt is None:
            self._runners.clear()
        else:
            key = rt.key()
            for k in [k for k in self._runners if k[0] == key]:
                del self._runners[k]

    def run(self, rt: Runtime, repeats: int = 5, deadline: Optional[float] = None,
            sizes: Optional[Sequence[tuple[str, int, int]]] = None) -> dict[str, Any]:
        """Per size: repeats of tokens/s, the setup seconds; sizes past the deadline are skipped
        (listed in 'skipped')."""
        return time_sizes(self, rt, self.grid.sizes() if sizes is None else sizes, repeats,
                          deadline)


def table_row(result: dict[str, Any]) -> dict[str, Any]:
    """Medians and spreads of a Bench.run result plus its geometric mean (plain dict)."""
    import statistics

    per = result["per_size_samples"]
    n = min((len(v) for v in per.values()), default=0)
    return {
        "per_size": {k: statistics.median(v) for k, v in per.items()},
        "spread": {k: rel_spread(v) for k, v in per.items()},
        "geomean": statistics.median([geomean([v[i] for v in per.values()]) for i in range(n)]) if n else 0.0,
        "setup_s": result.get("setup_s", {}),
        "skipped": result.get("skipped", []),
    }


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
