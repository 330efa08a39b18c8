"""kernelsearch.integrations.transformers on tiny Llama, Qwen2, Qwen3 and Mistral models (float32,
random weights, configs from tuner.workloads.hf), with a table that covers their shapes so the
Triton kernels run under the interpreter: the patched model's logits match the plain model's for
prefill and 16 decode steps, greedy tokens are identical with a StaticCache and with
`model.generate`, a fullgraph compile of the patched decode step has no graph break, and unpatch
restores every forward."""
from __future__ import annotations

import sys

import pytest
import torch

from kernelsearch import dispatch
from kernelsearch.integrations import transformers as mt
from tests.hfhelpers import covering_table
from tuner.workloads.hf import HFModel

STEPS = 16


@pytest.fixture(autouse=True)
def _clean():
    yield
    dispatch.install(None)


def _forwards(model) -> dict:
    """Every instance-level forward and the modeling modules' rotary functions."""
    out = {("fwd", id(m)): m.__dict__.get("forward") for m in model.modules()}
    for m in model.modules():
        mod = sys.modules[type(m).__module__]
        if hasattr(mod, "apply_rotary_pos_emb"):
            out[("rope", mod.__name__)] = mod.apply_rotary_pos_emb
    out["attn"] = model.config._attn_implementation
    return out


def _greedy(model, ids, cache_len) -> tuple[list, list]:
    """Prefill then STEPS greedy steps through a StaticCache: (logits per step, tokens)."""
    from transformers import StaticCache

    cache = StaticCache(config=model.config, max_cache_len=cache_len)
    logits, toks = [], []
    with torch.no_grad():
        out = model(input_ids=ids, past_key_values=cache, use_cache=True).logits[:, -1]
        for _ in range(STEPS):
            logits.append(out)
            nxt = out.argmax(-1, keepdim=True)
            toks.append(nxt)
            out = model(input_ids=nxt, past_key_values=cache, use_cache=True).logits[:, -1]
    return logits, torch.cat(toks, 1)


def _expected_kernel_calls(cfg, batch_rows_prefill: int) -> tuple[int, int]:
    """Op calls that run a kernel: (prefill, one decode step). Per layer: 2 norms (+2 q/k norms
    for Qwen3), the MLP's swiglu, and at decode the rope and the attention; one final norm."""
    qk = 2 if cfg.model_type == "qwen3" else 0
    n = cfg.num_hidden_layers
    return n * (2 + qk + 1) + 1, n * (2 + qk + 1 + 2) + 1


@pytest.mark.parametrize("spec", ["tiny-llama", "tiny-qwen3", "tiny-mistral"])
def test_patched_model_matches_the_plain_one_and_runs_the_kernels(spec):
    m = HFModel(spec)
    model, cfg = m.model, m.config
    ids = torch.randint(0, cfg.vocab_size, (2, 20), generator=torch.Generator().manual_seed(0))
    ref_logits, ref_toks = _greedy(model, ids, 20 + STEPS + 140)  # a buffer past SPLIT (128)
    with torch.no_grad():
        ref_gen = model.generate(ids, max_new_tokens=STEPS, do_sample=False,
                                 attention_mask=torch.ones_like(ids))
    plain = _forwards(model)

    table = covering_table(cfg)
    assert mt.patch(model, table) is model
    assert mt.patched(model) == {"rmsnorm": 2 * cfg.num_hidden_layers + 1
                                 + (2 * cfg.num_hidden_layers if cfg.model_type == "qwen3" else 0),
                                 "mlp": cfg.num_hidden_layers, "rope": 1, "attention": 1}
    assert model.config._attn_implementation == mt.ATTN
    s0 = dispatch.stats()
    new_logits, new_toks = _greedy(model, ids, 20 + STEPS + 140)
    s1 = dispatch.stats()
    pre, dec = _expected_kernel_calls(cfg, 40)
    # every op call of the patched model ran a table kernel: none went to torch
    assert s1["fallback"] == s0["fallback"]
    assert s1["kernel"] - s0["kernel"] == pre + STEPS * dec
    for i, (a, b) in enumerate(zip(ref_logits, new_logits)):
        torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-4, msg=f"{spec} step {i}")
    assert torch.equal(new_toks, ref_toks)
    with torch.no_grad():  # generate's own (dynamic) cache: exact-length attention
        gen = model.generate(ids, max_new_tokens=STEPS, do_sample=False,
                             attention_mask=torch.ones_like(ids))
    assert torch.equal(gen, ref_gen)
    assert dispatch.stats()["kernel"] > s1["kernel"]

    assert mt.unpatch(model) is model
    assert _forwards(model) == plain
    assert mt.patched(model) == {}
    s2 = dispatch.stats()
    again, _ = _greedy(model, ids[:, :8], 8 + STEPS)  # the plain path: no op calls at all
    assert dispatch.stats() == s2


def test_left_padding_is_masked_in_the_kernel():
    """A left-padded batch through generate with a StaticCache: the mask's holes reach the
    kernel (positions that are filled but padded weigh zero)."""
    m = HFModel("tiny-qwen2")
    model = m.model
    ids = torch.randint(3, 256, (2, 12), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, :5] = 0
    ids[1, :5] = 0
    kw = dict(max_new_tokens=6, do_sample=False, attention_mask=mask, pad_token_id=0,
              cache_implementation="static", return_dict_in_generate=True, output_logits=True)
    with torch.no_grad():
        ref = model.generate(ids, **kw)
    mt.patch(model, covering_table(m.config))
    s0 = dispatch.stats()
    with torch.no_grad():
        new = model.generate(ids, **kw)
    assert dispatch.stats()["kernel"] > s0["kernel"] and dispatch.stats()["fallback"] == s0["fallback"]
    assert torch.equal(new.sequences, ref.sequences)
    for a, b in zip(ref.logits, new.logits):
        torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-4)
    mt.unpatch(model)


def test_fullgraph_compile_of_the_patched_decode_step_has_no_graph_break():
    from transformers import StaticCache

    m = HFModel("tiny-llama")
    model = m.model
    mt.patch(model, covering_table(m.config))
    ids = torch.randint(0, 256, (2, 10), generator=torch.Generator().manual_seed(2))
    cache = StaticCache(config=model.config, max_cache_len=32)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm

    def step(tok, cache):
        return model(input_ids=tok, past_key_values=cache, use_cache=True).logits

    with torch.no_grad():
        model(input_ids=ids, past_key_values=cache, use_cache=True)  # prefill, eager
        tok = ids[:, -1:]
        fn = torch.compile(step, fullgraph=True, backend=backend)  # raises on a graph break
        s0 = dispatch.stats()
        out = fn(tok, cache)
        assert dispatch.stats()["kernel"] - s0["kernel"] == _expected_kernel_calls(m.config, 0)[1]
    assert len(graphs) == 1
    code = graphs[0].code
    for op in ("decode_attention_cache", "rmsnorm", "swiglu", "rope"):
        assert f"metaltune.{op}" in code, op
    # the same step eagerly, on a cache in the same state
    cache2 = StaticCache(config=model.config, max_cache_len=32)
    with torch.no_grad():
        model(input_ids=ids, past_key_values=cache2, use_cache=True)
        torch.testing.assert_close(step(tok, cache2), out, atol=1e-5, rtol=1e-5)
    mt.unpatch(model)


def test_a_table_that_does_not_cover_the_model_leaves_it_plain():
    from kernelsearch.table import DispatchTable, Entry

    m = HFModel("tiny-llama")
    before = _forwards(m.model)
    other = DispatchTable([Entry("rmsnorm", "float32", {"cols": 4096}, {"rows": [1, 64]}, "row",
                                 {"ROWS": 1, "num_warps": 4}),
                           Entry("rmsnorm", "bfloat16", {"cols": 64}, {"rows": [1, 64]}, "row",
                                 {"ROWS": 1, "num_warps": 1})])
    mt.patch(m.model, other)
    assert mt.patched(m.model) == {}
    assert _forwards(m.model) == before
    mt.unpatch(m.model)
    assert _forwards(m.model) == before


def test_register_makes_the_implementation_loadable_by_name():
    from transformers import AutoModelForCausalLM

    mt.register()
    m = HFModel("tiny-llama")
    model = AutoModelForCausalLM.from_config(m.config, attn_implementation=mt.ATTN)
    assert model.config._attn_implementation == mt.ATTN
    ids = torch.randint(0, 256, (1, 6), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=3, do_sample=False)
    assert out.shape == (1, 9)


def test_shipped_table_names():
    assert mt.gpu_slug("NVIDIA H200") == "h200"
    assert mt.gpu_slug("NVIDIA H100 80GB HBM3") == "h100"
    p = mt.shipped_table("NVIDIA H200")
    assert p is not None and p.name == "h200-graphs.json"
    assert mt.shipped_table("NVIDIA T4") is None


def test_a_patched_model_dropped_without_unpatch_releases_the_rotary_wrapper():
    import gc

    import transformers.models.llama.modeling_llama as ml

    orig = ml.apply_rotary_pos_emb
    m = HFModel("tiny-llama")
    mt.patch(m.model, covering_table(m.config))
    assert ml.apply_rotary_pos_emb is not orig and ml.apply_rotary_pos_emb.__wrapped__ is orig
    del m
    gc.collect()
    assert ml.apply_rotary_pos_emb is orig
