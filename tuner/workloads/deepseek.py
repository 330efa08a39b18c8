"""The DeepSeek-V3 decode workload: its first three layers (the dense ones of the real model) in
plain torch with random weights, multi-head latent attention over a paged latent cache.

Shapes are DeepSeek-V3's (kernelsearch/context/models/deepseek-mla.md): hidden 7168, 128 heads,
q_lora 1536, kv_lora 512, rope 64, nope 128, v 128, dense FFN 18432, vocab 129280. Weights are
seeded random normals scaled 1/sqrt(fan_in), norms 1 + 0.1 N(0,1), as the Llama workload's.

- decode: weight absorption (q' = W_UK^T q_nope, out = W_UV o'), so every head attends to the
  same cached 576-wide latent (512 compressed + 64 rope) through `ops.mla_decode`: the
  `mla_decode` family's kernel where a dispatch table covers the call, the torch path (page
  gather, bmm, float softmax, bmm) otherwise; one token per sequence, CUDA graphs on a GPU.
- prefill: without absorption (per-head K and V decompressed from the latent, causal SDPA), as
  serving engines run it; it fills the latent cache.
- V3.2 (`sparse`): a lightning indexer in plain torch (64 heads of 128, ReLU-scored, its own
  paged key cache) picks the top-2048 past tokens per sequence and `ops.mla_sparse_decode`
  attends to those only.

The cache is paged as serving engines keep it: [num_blocks, 64, 576] per layer, one shuffled
block table shared by the layers. Runners, the size grid, the output check against the plain
path and the Workload (search mixed, the holistic gate) are the Llama workload's
(tuner.workloads.llama), which take any model with this interface. No pydantic here either.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Optional

from tuner.workloads import llama as _llama
from tuner.workloads.holistic import GridDefaults, Presets
from tuner.workloads.llama_ops import Ops


@dataclass(frozen=True)
class DeepSeekConfig(Presets):  # .preset(name), .of(name | config | dict)
    dim: int = 7168
    n_layers: int = 3
    n_heads: int = 128
    q_lora: int = 1536
    kv_lora: int = 512
    rope_dim: int = 64
    nope_dim: int = 128
    v_dim: int = 128
    ffn_dim: int = 18432
    vocab: int = 129280
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6
    dtype: str = "bfloat16"
    page: int = 64
    sparse: bool = False  # V3.2: lightning indexer + top-k sparse attention
    topk: int = 2048
    index_heads: int = 64
    index_dim: int = 128
    # query tokens a decode step (multi-token prediction verifies a draft: 2), and ragged
    # batches (each request its own length, drawn per cache; sequence 0 at the full context)
    s_q: int = 1
    ragged: bool = False

    @property
    def latent(self) -> int:
        return self.kv_lora + self.rope_dim

    @property
    def scale(self) -> float:
        return 1.0 / math.sqrt(self.nope_dim + self.rope_dim)

    def validate(self) -> "DeepSeekConfig":
        if self.rope_dim % 2 or self.page < 1 or self.topk < 1:
            raise ValueError(f"model: rope dim {self.rope_dim} must be even, page "
                             f"{self.page} and topk {self.topk} positive")
        if self.s_q not in (1, 2) or self.n_heads < 1 or (self.sparse and self.s_q != 1):
            raise ValueError(f"model: s_q {self.s_q} must be 1 or 2 (1 for V3.2) and heads "
                             f"{self.n_heads} positive")
        return self


PRESETS: dict[str, DeepSeekConfig] = {
    # CPU tests: the real latent (512 + 64, what the MLA kernels take), everything else small;
    # float16, a dtype the kernels take (the interpreter's bf16 dot is not faithful)
    "tiny": DeepSeekConfig(dim=64, n_layers=2, n_heads=4, q_lora=32, nope_dim=16, v_dim=16,
                           ffn_dim=128, vocab=256, page=16, dtype="float16"),
    "tiny-v3.2": DeepSeekConfig(dim=64, n_layers=2, n_heads=4, q_lora=32, nope_dim=16, v_dim=16,
                                ffn_dim=128, vocab=256, page=16, dtype="float16", sparse=True,
                                topk=16, index_heads=4, index_dim=16),
    "deepseek-v3-3l": DeepSeekConfig(),
    "deepseek-v3.2-3l": DeepSeekConfig(sparse=True),
}
DeepSeekConfig.PRESETS = PRESETS


@dataclass
class PagedLatentCache:
    """Per layer the latent cache [num_blocks, page, 576] (and, for V3.2, the indexer's keys
    [num_blocks, page, index_dim]); one block table [B, max_blocks] int32 for all layers, its
    pages shuffled among spare ones as a serving engine's allocator leaves them."""

    kv: list
    index_k: list
    block_table: Any
    length: int  # token capacity a sequence may use (<= max_blocks * page)
    # ragged: each sequence's share of the step's position, in 1/RAGGED_DEN (sequence 0 whole);
    # None: every sequence at the same position
    share: Any = None


RAGGED_DEN = 1024


class DeepSeek:
    def __init__(self, cfg: DeepSeekConfig, device: str = "cpu", seed: int = 0):
        import torch

        self.cfg = cfg.validate()
        self.device = torch.device(device)
        self.dtype = getattr(torch, cfg.dtype)
        gen = torch.Generator(device=self.device).manual_seed(seed)

        def w(fan_in: int, *shape: int) -> Any:
            t = torch.randn(*shape, generator=gen, device=self.device, dtype=self.dtype)
            return t.mul_(1.0 / math.sqrt(fan_in))

        def linear(fan_in: int, fan_out: int) -> Any:  # [out, in] storage, used as its .t()
            return w(fan_in, fan_out, fan_in).t()

        def norm_w(n: int) -> Any:
            return (1.0 + 0.1 * torch.randn(n, generator=gen, device=self.device)).to(self.dtype)

        c = self.cfg
        H, qk = c.n_heads, c.nope_dim + c.rope_dim
        self.embed = w(1, c.vocab, c.dim) * 0.5
        self.layers = []
        for _ in range(c.n_layers):
            L = {"attn_norm": norm_w(c.dim), "ffn_norm": norm_w(c.dim),
                 "q_norm": norm_w(c.q_lora), "kv_norm": norm_w(c.kv_lora),
                 "wq_a": linear(c.dim, c.q_lora), "wq_b": linear(c.q_lora, H * qk),
                 "wkv_a": linear(c.dim, c.latent),
                 "wkv_b": linear(c.kv_lora, H * (c.nope_dim + c.v_dim)),
                 "wo": linear(H * c.v_dim, c.dim),
                 "w_gate": linear(c.dim, c.ffn_dim), "w_up": linear(c.dim, c.ffn_dim),
                 "w_down": linear(c.ffn_dim, c.dim)}
            # absorption: W_UK [H, nope, 512] and W_UV^T [H, 512, v], views of wkv_b's storage
            kvb = L["wkv_b"].t().view(H, c.nope_dim + c.v_dim, c.kv_lora)
            L["w_uk"] = kvb[:, :c.nope_dim]
            L["w_uv_t"] = kvb[:, c.nope_dim:].transpose(1, 2)
            self.layers.append(L)
        self.final_norm = norm_w(c.dim)
        self.lm_head = linear(c.dim, c.vocab)
        if c.sparse:  # drawn last: the V3.2 form shares every other weight with V3's
            for L in self.layers:
                L["wi_q"] = linear(c.q_lora, c.index_heads * c.index_dim)
                L["wi_k"] = linear(c.dim, c.index_dim)
                L["wi_w"] = linear(c.dim, c.index_heads)
        self._rope: Optional[tuple[Any, Any]] = None
        self._fused = False

    def ensure_fused(self) -> None:
        """wq_a|wkv_a (both read the normed hidden state) and gate|up as one matmul each."""
        import torch

        if self._fused:
            return
        for L in self.layers:
            L["w_a"] = torch.cat([L["wq_a"].t(), L["wkv_a"].t()], dim=0).t()
            L["w_gu"] = torch.cat([L["w_gate"].t(), L["w_up"].t()], dim=0).t()
        self._fused = True

    # -- rotary (the 64 rope dims, half rotation, fp32 math) ------------------------------------
    def rope(self, n: int) -> tuple[Any, Any]:
        import torch

        if self._rope is None or self._rope[0].shape[0] < n:
            d = self.cfg.rope_dim
            inv = 1.0 / (self.cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
            ang = torch.outer(torch.arange(max(n, 64), dtype=torch.float64), inv)
            self._rope = (ang.cos().float().to(self.device), ang.sin().float().to(self.device))
        return self._rope

    apply_rope = staticmethod(_llama.Llama.apply_rope)  # the same half rotation, fp32 math

    # -- the paged cache -------------------------------------------------------------------------
    def new_cache(self, batch: int, length: int, fill: str = "random",
                  seed: int = 1) -> PagedLatentCache:
        import torch

        c = self.cfg
        mb = -(-length // c.page)
        nblocks = batch * mb + max(1, mb // 8)
        g = torch.Generator(device="cpu").manual_seed(seed)
        table = torch.randperm(nblocks, generator=g)[:batch * mb].view(batch, mb)
        gen = torch.Generator(device=self.device).manual_seed(seed)

        def block(width: int) -> Any:
            shape = (nblocks, c.page, width)
            if fill == "random":  # decode timings at long contexts need no prefill
                return torch.randn(shape, generator=gen, device=self.device, dtype=self.dtype)
            return torch.zeros(shape, device=self.device, dtype=self.dtype)

        kv = [block(c.latent) for _ in range(c.n_layers)]
        ik = [block(c.index_dim) for _ in range(c.n_layers)] if c.sparse else []
        share = None
        if c.ragged:  # a length drawn per request, the longest one at the full context
            share = torch.randint(1, RAGGED_DEN + 1, (batch,), generator=g)
            share[0] = RAGGED_DEN
            share = share.to(self.device)
        return PagedLatentCache(kv, ik, table.to(torch.int32).to(self.device), length, share)

    @staticmethod
    def cache_len(cache: PagedLatentCache) -> int:
        return cache.length

    def _rows(self, cache: PagedLatentCache, pos: Any) -> Any:
        """Physical cache rows of positions pos [B, S] (device tensors: graph-capturable)."""
        p = self.cfg.page
        return (cache.block_table.gather(1, pos // p).long() * p + pos % p).reshape(-1)

    # -- attention ---------------------------------------------------------------------------------
    def _indexer(self, L: dict, cache: PagedLatentCache, layer: int, cq: Any, h: Any,
                 lens: Any) -> Any:
        """DSA's lightning indexer in plain torch: I(t, s) = sum_j w_j relu(q_j . k_s) over the
        cached index keys; the top-k positions < length, -1 in the slots left over."""
        import torch

        c = self.cfg
        B = h.shape[0]
        qi = (cq @ L["wi_q"]).view(B, c.index_heads, c.index_dim)
        wi = (h @ L["wi_w"]).float() * (c.index_heads ** -0.5)
        keys = cache.index_k[layer][cache.block_table.long()].view(B, -1, c.index_dim)
        s = torch.relu(torch.bmm(qi, keys.transpose(1, 2)).float())  # [B, Hi, cap]
        score = (s * wi[:, :, None]).sum(1)
        pos = torch.arange(score.shape[1], device=h.device)
        score = score.masked_fill(pos[None, :] >= lens[:, None], float("-inf"))
        k = min(c.topk, score.shape[1])
        val, idx = score.topk(k, dim=1)
        idx = torch.where(val > float("-inf"), idx, -1).to(torch.int32)
        if k < c.topk:
            idx = torch.cat([idx, idx.new_full((B, c.topk - k), -1)], dim=1)
        return idx

    def step_positions(self, pos: Any, batch: int, cache: PagedLatentCache) -> Any:
        """[B, s_q] int64 positions of the step's query tokens: the last at `pos` (ragged: at
        each sequence's share of it, at least s_q - 1), the draft tokens before it."""
        import torch

        c = self.cfg
        last = (torch.full((batch,), pos, dtype=torch.int64, device=self.device)
                if isinstance(pos, int) else pos.view(1).expand(batch).long())
        if cache.share is not None:
            last = torch.clamp((last + 1) * cache.share // RAGGED_DEN - 1, min=c.s_q - 1)
        return last[:, None] - (c.s_q - 1) + torch.arange(c.s_q, device=self.device)[None, :]

    def decode_step(self, ops: Ops, tokens: Any, pos: Any, cache: PagedLatentCache) -> Any:
        """One step per sequence ending at position `pos` (an int, or a one-element device
        tensor as serving engines pass it); writes its latent rows and returns the last
        token's logits (B, vocab) fp32. s_q = 2 (multi-token prediction) verifies a draft: the
        step's two tokens at pos - 1 and pos (the draft is the same token id: speed does not
        depend on it), causal within the step. Ragged: each sequence at its own length."""
        import torch

        c = self.cfg
        B, H, S = tokens.shape[0], c.n_heads, c.s_q
        if isinstance(pos, int):
            self.rope(pos + 1)
        assert self._rope is not None, "build the rotary table first: model.rope(max_len)"
        p = self.step_positions(pos, B, cache)  # [B, S]
        cos = self._rope[0].index_select(0, p.reshape(-1))  # [B*S, rope/2]
        sin = self._rope[1].index_select(0, p.reshape(-1))
        rows = self._rows(cache, p)
        lens = (p[:, -1] + 1).to(torch.int32)
        ops.elementwise()
        x = self.embed[tokens.repeat_interleave(S)] if S > 1 else self.embed[tokens]
        B = B * S  # the rows every projection runs on: both tokens of a step
        for i, L in enumerate(self.layers):
            h = ops.rmsnorm(x, L["attn_norm"], c.norm_eps)
            if ops.rt.fuse_projections:
                self.ensure_fused()
                a = ops.matmul(h, L["w_a"])
                qa, kva = a[:, :c.q_lora], a[:, c.q_lora:]
            else:
                qa, kva = ops.matmul(h, L["wq_a"]), ops.matmul(h, L["wkv_a"])
            cq = ops.rmsnorm(qa, L["q_norm"], c.norm_eps)
            q = ops.matmul(cq, L["wq_b"]).view(B, H, c.nope_dim + c.rope_dim)
            q_pe = self.apply_rope(q[..., c.nope_dim:], cos[:, None], sin[:, None])
            lat = ops.rmsnorm(kva[:, :c.kv_lora], L["kv_norm"], c.norm_eps)
            k_pe = self.apply_rope(kva[:, c.kv_lora:], cos, sin)
            # absorbed query: [H, B, nope] @ [H, nope, 512] -> [B, H, 512], then the rope part
            q_lat = torch.bmm(q[..., :c.nope_dim].transpose(0, 1), L["w_uk"]).transpose(0, 1)
            q_full = torch.cat([q_lat, q_pe], dim=-1)
            cache.kv[i].view(-1, c.latent).index_copy_(0, rows, torch.cat([lat, k_pe], dim=-1))
            ops.elementwise(4)
            if c.sparse:
                cache.index_k[i].view(-1, c.index_dim).index_copy_(0, rows, h @ L["wi_k"])
                idx = self._indexer(L, cache, i, cq, h, lens)
                o = ops.mla_sparse_decode(q_full, cache.kv[i], cache.block_table, lens, idx,
                                          c.scale)
            elif S > 1:
                o = ops.mla_decode_mtp(q_full.view(B // S, S, H, c.latent), cache.kv[i],
                                       cache.block_table, lens, c.scale).view(B, H, c.kv_lora)
            else:
                o = ops.mla_decode(q_full, cache.kv[i], cache.block_table, lens, c.scale)
            o = torch.bmm(o.transpose(0, 1), L["w_uv_t"]).transpose(0, 1)  # [B, H, v]
            x = x + ops.matmul(o.reshape(B, H * c.v_dim), L["wo"])
            h = ops.rmsnorm(x, L["ffn_norm"], c.norm_eps)
            x = x + self._mlp(ops, L, h)
            ops.elementwise(2)
        if S > 1:
            x = x.view(B // S, S, c.dim)[:, -1]
        x = ops.rmsnorm(x, self.final_norm, c.norm_eps)
        return ops.matmul(x, self.lm_head).float()

    def _mlp(self, ops: Ops, L: dict, h: Any) -> Any:
        if ops.rt.fuse_projections and h.shape[0] <= 64:
            self.ensure_fused()
            gu = ops.matmul(h, L["w_gu"])
            f = self.cfg.ffn_dim
            return ops.matmul(ops.swiglu(gu[:, :f], gu[:, f:]), L["w_down"])
        return ops.matmul(ops.swiglu(ops.matmul(h, L["w_gate"]), ops.matmul(h, L["w_up"])),
                          L["w_down"])

    def prefill(self, ops: Ops, tokens: Any, cache: Optional[PagedLatentCache] = None) -> Any:
        """Causal forward over tokens (B, S) without absorption: per-head K = [W_UK c, k_pe],
        V = W_UV c, causal SDPA. Fills the latent (and index key) cache at positions < S;
        returns the last position's logits (B, vocab) fp32."""
        import torch
        import torch.nn.functional as F

        c = self.cfg
        B, S = tokens.shape
        H = c.n_heads
        cos, sin = self.rope(S) if self._rope is None else self._rope
        cos, sin = cos[:S, None], sin[:S, None]  # broadcast over heads: [S, 1, d/2]
        x = self.embed[tokens].reshape(B * S, c.dim)
        rows = None
        if cache is not None:
            pos = torch.arange(S, device=self.device)[None, :].expand(B, S)
            rows = self._rows(cache, pos)
        for i, L in enumerate(self.layers):
            h = ops.rmsnorm(x, L["attn_norm"], c.norm_eps)
            qa, kva = ops.matmul(h, L["wq_a"]), ops.matmul(h, L["wkv_a"])
            cq = ops.rmsnorm(qa, L["q_norm"], c.norm_eps)
            q = ops.matmul(cq, L["wq_b"]).view(B, S, H, c.nope_dim + c.rope_dim)
            q_pe = self.apply_rope(q[..., c.nope_dim:], cos, sin)
            lat = ops.rmsnorm(kva[:, :c.kv_lora], L["kv_norm"], c.norm_eps)
            k_pe = self.apply_rope(kva[:, c.kv_lora:].view(B, S, 1, c.rope_dim), cos, sin)
            kv = ops.matmul(lat, L["wkv_b"]).view(B, S, H, c.nope_dim + c.v_dim)
            k = torch.cat([kv[..., :c.nope_dim], k_pe.expand(B, S, H, c.rope_dim)], dim=-1)
            qf = torch.cat([q[..., :c.nope_dim], q_pe], dim=-1)
            a = F.scaled_dot_product_attention(qf.transpose(1, 2), k.transpose(1, 2),
                                               kv[..., c.nope_dim:].transpose(1, 2),
                                               is_causal=True, scale=c.scale)
            if rows is not None:
                cache.kv[i].view(-1, c.latent).index_copy_(
                    0, rows, torch.cat([lat, k_pe.reshape(B * S, c.rope_dim)], dim=-1))
                if c.sparse:
                    cache.index_k[i].view(-1, c.index_dim).index_copy_(0, rows, h @ L["wi_k"])
            ops.elementwise(6)
            x = x + ops.matmul(a.transpose(1, 2).reshape(B * S, H * c.v_dim), L["wo"])
            h = ops.rmsnorm(x, L["ffn_norm"], c.norm_eps)
            x = x + self._mlp(ops, L, h)
            ops.elementwise(2)
        last = x.reshape(B, S, c.dim)[:, -1].contiguous()
        last = ops.rmsnorm(last, self.final_norm, c.norm_eps)
        return ops.matmul(last, self.lm_head).float()


class DeepSeekWorkload(_llama.LlamaWorkload):
    """The holistic workload over the DeepSeek model: decode tokens/s per context (prefill
    optional), outputs checked against the plain torch path once per runtime. A LlamaWorkload
    in everything but the model, so `search mixed` traces its kernel slots (mla_decode or
    mla_sparse_decode, and the matmul/rmsnorm/swiglu calls) the same way; its runtime
    dimensions are only the settings this model reads (its attention is MLA: no attn_impl)."""

    Config = DeepSeekConfig
    Model = DeepSeek
    CPU_GRID = GridDefaults(contexts=(20, 70), decode_batch=2, decode_steps=3)
    GPU_GRID = GridDefaults(contexts=(4096, 32768, 131072), decode_batch=32, decode_steps=10)
    PREFILL = False
    #: what a mixed search may change here: CUDA graphs (the runners) and fused projections
    #: (wq_a|wkv_a and gate|up, read by DeepSeek.decode_step and _mlp)
    RUNTIME_DIMS: dict[str, list[Any]] = {"cuda_graphs": [True, False],
                                          "fuse_projections": [False, True]}

    @property  # type: ignore[override]
    def name(self) -> str:
        return "deepseek-v3.2" if self.model.cfg.sparse else "deepseek"


def v32(cfg: DeepSeekConfig) -> DeepSeekConfig:
    """The V3.2 (sparse) form of a config."""
    return replace(cfg, sparse=True)


def from_spec(spec: Any) -> DeepSeekWorkload:
    """`deepseek[-v3.2][:batch=B[,B..]][:ctx=C[,C..]][:heads=H][:sq=1|2][:ragged=0|1]`
    (tuner.workloads.factory): the size grid's decode batches and contexts (default: the
    workload's own grid); the heads a GPU holds (tensor parallel 8/4/2: 16/32/64, default all
    128), the query tokens a decode step (2: multi-token prediction; dense only) and ragged
    batches (a length drawn per request). The real three layers on a GPU, the tiny preset on
    the CPU (interpreter kernels)."""
    import torch

    from tuner.errors import BadInput

    grid: dict[str, list[int]] = {}
    model: dict[str, Any] = {}
    for part in spec.args.split(":") if spec.args else []:
        key, eq, value = part.partition("=")
        nums = value.split(",")
        ok = eq and all(n.isdigit() for n in nums) and (
            (key in ("batch", "ctx") and all(int(n) > 0 for n in nums))
            or (key == "heads" and len(nums) == 1 and int(value) > 0)
            or (key == "sq" and value in ("1", "2"))
            or (key == "ragged" and value in ("0", "1")))
        if not ok:
            raise BadInput(f"--workload {spec.text}: expected batch=N[,N..], ctx=N[,N..], "
                           f"heads=N, sq=1|2 or ragged=0|1 (positive integers), got {part!r}")
        if key in ("batch", "ctx"):
            grid["decode_batches" if key == "batch" else "contexts"] = [int(n) for n in nums]
        else:
            model[{"heads": "n_heads", "sq": "s_q", "ragged": "ragged"}[key]] = (
                bool(int(value)) if key == "ragged" else int(value))
    if spec.name == "deepseek-v3.2" and model.get("s_q", 1) != 1:
        raise BadInput(f"--workload {spec.text}: sq=2 (multi-token prediction) is for the "
                       f"dense model (deepseek), not {spec.name}")
    big = torch.cuda.is_available()
    preset = {("deepseek", True): "deepseek-v3-3l", ("deepseek", False): "tiny",
              ("deepseek-v3.2", True): "deepseek-v3.2-3l",
              ("deepseek-v3.2", False): "tiny-v3.2"}[(spec.name, big)]
    return DeepSeekWorkload(replace(DeepSeekConfig.preset(preset), **model), **grid)
