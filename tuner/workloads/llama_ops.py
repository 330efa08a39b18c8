"""The Llama workload's kernel adapter: every hot operation of its call path (the eight kernel
families' call sites: rmsnorm, swiglu, matmul, rope, decode attention, MLA decode, sparse MLA
decode; prefill attention and elementwise launches for the launch accounting) through
`kernelsearch.dispatch.call(family, ...)`, or the plain torch op the reference code writes.
Shared by tuner.workloads.llama, .deepseek and .tensor_parallel."""
from __future__ import annotations

import math
import time
from typing import Any, Callable

from tuner.workloads.llama_runtime import Runtime


def apply_rope(x: Any, cos: Any, sin: Any) -> Any:
    """x (B, H, S, D); cos/sin (S, D/2): rotate (first half, second half) pairs."""
    import torch

    h = x.shape[-1] // 2
    xf = x.float()
    x1, x2 = xf[..., :h], xf[..., h:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).type_as(x)


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

    def __init__(self, runtime: "Runtime", dispatch: Any = None):
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
        return apply_rope(x, cos.unsqueeze(-2), sin.unsqueeze(-2))

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
    def plain_mla_decode_mtp(q: Any, kv_cache: Any, block_table: Any, seq_lens: Any,
                             scale: float) -> Any:
        """q [B, s_q, H, 576], causal within the step (the family's torch path)."""
        from kernelsearch.families import get

        return get("mla_decode_mtp").torch_default(q, kv_cache, block_table, seq_lens, scale)

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

    def mla_decode_mtp(self, q: Any, kv_cache: Any, block_table: Any, seq_lens: Any,
                       scale: float) -> Any:
        return self._call("mla_decode_mtp", self.plain_mla_decode_mtp, q, kv_cache, block_table,
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
