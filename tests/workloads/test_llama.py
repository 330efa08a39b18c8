"""The tiny Llama: correct against an independent reference, and against the plain torch path."""
import math

import pytest
import torch

from tuner.errors import WorkloadFailed
from tuner.workloads.llama import (Llama, LlamaConfig, LlamaWorkload, Ops, Runtime, check,
                                   rel_err)


def reference_logits(m: Llama, tokens: torch.Tensor) -> torch.Tensor:
    """Every position's logits, written out longhand: explicit K/V head repetition, explicit
    causal mask and softmax, complex-number rotary. Shares only the weights with the model."""
    c = m.cfg
    B, S = tokens.shape
    hd, g = c.head_dim, c.n_heads // c.n_kv_heads
    inv = 1.0 / (c.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    rot = torch.polar(torch.ones(S, hd // 2, dtype=torch.float64),
                      torch.outer(torch.arange(S, dtype=torch.float64), inv))

    def rope(x):  # (B, S, H, hd): pairs (i, i + hd/2) as complex numbers
        z = torch.complex(x[..., : hd // 2].double(), x[..., hd // 2:].double()) * rot[None, :, None]
        return torch.cat([z.real, z.imag], -1).float()

    def norm(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + c.norm_eps) * w

    x = m.embed[tokens].float()
    mask = torch.full((S, S), float("-inf")).triu(1)
    for L in m.layers:
        h = norm(x, L["attn_norm"])
        q = rope((h @ L["wq"]).view(B, S, c.n_heads, hd))
        k = rope((h @ L["wk"]).view(B, S, c.n_kv_heads, hd)).repeat_interleave(g, dim=2)
        v = (h @ L["wv"]).view(B, S, c.n_kv_heads, hd).repeat_interleave(g, dim=2)
        att = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(hd) + mask
        o = torch.einsum("bhqk,bkhd->bqhd", att.softmax(-1), v).reshape(B, S, -1)
        x = x + o @ L["wo"]
        h = norm(x, L["ffn_norm"])
        x = x + (torch.nn.functional.silu(h @ L["w_gate"]) * (h @ L["w_up"])) @ L["w_down"]
    return norm(x, m.final_norm) @ m.lm_head


@pytest.fixture(scope="module")
def model():
    return Llama(LlamaConfig.preset("tiny"), "cpu", seed=0)


def test_prefill_and_cached_decode_match_the_longhand_reference(model):
    toks = torch.randint(0, model.cfg.vocab, (2, 13), generator=torch.Generator().manual_seed(5))
    ref = reference_logits(model, toks)
    ops = Ops(Runtime(use_dispatch=False))
    cache = model.new_cache(2, 16, fill="zeros")
    with torch.no_grad():
        last = model.prefill(ops, toks[:, :10], cache)
        assert rel_err(last, ref[:, 9]) < 1e-5
        for pos in (10, 11, 12):  # three decode steps through the KV cache
            step = model.decode_step(ops, toks[:, pos], pos, cache)
            assert rel_err(step, ref[:, pos]) < 1e-5
    # and the logits are not degenerate (a zero model would also 'match')
    assert ref.std() > 0.1


@pytest.mark.parametrize("rt", [
    {},
    {"fuse_projections": True},
    {"attn_impl": "split_kv", "kv_split": 8},
    {"attn_impl": "split_kv", "kv_split": 1000},
])
def test_runtime_variants_match_the_plain_torch_path(model, rt):
    res = check(model, Runtime.from_dict(rt), ctx=40)
    assert res["ok"], res
    assert res["errors"]["decode"] < 1e-5 and res["errors"]["prefill"] < 1e-5


class _WrongRmsnorm:
    """A dispatcher whose rmsnorm forgets the weight: what a bad kernel would do."""

    def call(self, family, *args):
        if family == "rmsnorm":
            x, w, eps = args
            return Ops.plain_rmsnorm(x, torch.ones_like(w), eps)
        raise KeyError(family)


class _LayoutRecorder:
    """A dispatcher that records each matmul's operand layout and runs the plain op."""

    def __init__(self):
        self.layouts = []

    def call(self, family, *args):
        from kernelsearch.families import get

        if family == "matmul":
            self.layouts.append(get("matmul").layout_of(*args))
        return get(family).torch_default(*args)


@pytest.mark.parametrize("fuse", [False, True])
def test_every_projection_is_in_the_layout_kernel_tables_are_measured_on(fuse):
    """Weights are kept as nn.Linear stores them ([out, in]) and multiplied by the transposed
    view, the layout kernel tables are searched on; a row-major [in, out] weight would make
    dispatch hand every projection to torch."""
    from kernelsearch.families import get

    m = Llama(LlamaConfig.preset("tiny"), "cpu", seed=0)
    rec = _LayoutRecorder()
    ops = Ops(Runtime(fuse_projections=fuse), dispatch=rec)
    toks = torch.randint(0, m.cfg.vocab, (2, 5), generator=torch.Generator().manual_seed(1))
    cache = m.new_cache(2, 8, fill="zeros")
    with torch.no_grad():
        m.prefill(ops, toks, cache)
        m.decode_step(ops, toks[:, 0], 5, cache)
    per_layer = 4 if fuse else 7  # (qkv | q, k, v), o, (gate|up | gate, up), down
    assert len(rec.layouts) == 2 * (per_layer * m.cfg.n_layers + 1)  # + lm_head; two passes
    assert set(rec.layouts) == {get("matmul").layout}


def test_check_catches_a_dispatch_kernel_that_differs(model):
    res = check(model, Runtime(), dispatch=_WrongRmsnorm(), ctx=16)
    assert not res["ok"] and res["errors"]["prefill"] > 1e-3


def test_workload_refuses_to_time_a_wrong_path():
    wl = LlamaWorkload("tiny", contexts=[8], decode_batches=[1], device="cpu")
    wl.dispatch = _WrongRmsnorm()
    wl.bench.dispatch = wl.dispatch
    with pytest.raises(WorkloadFailed, match="differ from the plain torch path"):
        wl.measure(repeats=1)


def test_measure_reports_per_size_tokens_per_s_with_spread():
    wl = LlamaWorkload("tiny", contexts=[8, 32], decode_batches=[1, 2], prefill_batches=[1],
                       device="cpu")
    from tuner.workloads.base import Workload

    assert isinstance(wl, Workload)
    m = wl.measure(repeats=3)
    assert m.metric == "tokens_per_s" and m.unit == "tok/s"
    assert set(m.per_size) == {"prefill@ctx8,b1", "prefill@ctx32,b1", "decode@ctx8,b1",
                               "decode@ctx8,b2", "decode@ctx32,b1", "decode@ctx32,b2"}
    assert all(v > 0 for v in m.per_size.values())
    assert len(m.samples) == 3 and min(m.samples) <= m.value <= max(m.samples)
    assert all(len(v) == 3 for v in m.extra["per_size_samples"].values())
    assert m.extra["check"]["ok"] is True


def test_runtime_rejects_unknown_settings():
    with pytest.raises(ValueError, match="unknown setting.*cuda_graph\\b"):
        Runtime.from_dict({"cuda_graph": False})
    with pytest.raises(ValueError, match="attn_impl"):
        Runtime.from_dict({"attn_impl": "magic"})
    rt = Runtime.from_dict({"graph_capture_sizes": [1, 2], "max_ctx_to_capture": 64})
    assert rt.graphs_for(2, 64) and not rt.graphs_for(4, 64) and not rt.graphs_for(2, 128)
