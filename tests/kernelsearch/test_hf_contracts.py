"""transformers' own contracts on a patched model, written as this project's tests against the
real transformers 5.17 (its modeling test files are not in its wheel), for tiny Llama, Qwen2 and
Mistral configs on the CPU (float32, Triton's interpreter, a table covering their shapes):

- the user's attention choice: a model loaded `attn_implementation="eager"` stays eager (only
  the norms, MLPs and rotary go through the table), `attention=True` switches it anyway;
- attention weights when asked for (`output_attentions=True`, in a forward and in `generate`,
  with and without a cache, padded batches too): the model's own eager attention for that call,
  the same weights and logits as the plain eager model, gradients through them;
- `set_attn_implementation` away from "metaltune" and back, and unpatch after the user's switch;
- `copy.deepcopy` of a patched model computes with the copy's weights;
- `torch.save` of a patched model loads and computes in a fresh process.
(transformers' tests that assert the *name* "sdpa" after `patch` cannot hold by design: patch
replaces the default SDPA with "metaltune", documented in the module.)"""
from __future__ import annotations

import copy
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from kernelsearch import dispatch
from kernelsearch.integrations import transformers as mt
from tests.hfhelpers import covering_table
from tuner.workloads.hf import HFModel

SPECS = ["tiny-llama", "tiny-qwen2", "tiny-mistral"]
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(autouse=True)
def _clean():
    yield
    dispatch.install(None)


def _ids(cfg, b=2, s=7, seed=0):
    return torch.randint(0, cfg.vocab_size, (b, s), generator=torch.Generator().manual_seed(seed))


def _padded(cfg):
    ids = _ids(cfg)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # left padding in the second row
    return ids, mask


def _models(spec):
    """(patched model, plain eager model with the same weights, config)."""
    m = HFModel(spec)
    plain = copy.deepcopy(m.model)
    plain.set_attn_implementation("eager")
    mt.patch(m.model, covering_table(m.config))
    return m.model, plain, m.config


def _layers(cfg):
    return cfg.num_hidden_layers


@pytest.mark.parametrize("spec", SPECS)
def test_a_model_loaded_eager_stays_eager(spec):
    from transformers import AutoModelForCausalLM

    cfg = HFModel(spec).config
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    plain = copy.deepcopy(model)
    mt.patch(model, covering_table(cfg))
    assert model.config._attn_implementation == "eager"
    assert all(getattr(mod, "config", cfg)._attn_implementation == "eager" for mod in model.modules()
               if hasattr(getattr(mod, "config", None), "_attn_implementation"))
    rep = mt.patched(model)
    assert "attention" not in rep and rep["rmsnorm"] > 0 and rep["mlp"] == _layers(cfg)
    ids = _ids(cfg)
    model.config.output_attentions = True  # transformers allows this on eager models only
    plain.config.output_attentions = True
    with torch.no_grad():
        out, ref = model(ids), plain(ids)
    assert len(out.attentions) == _layers(cfg)
    torch.testing.assert_close(out.logits, ref.logits, atol=1e-5, rtol=1e-5)
    for a, r in zip(out.attentions, ref.attentions):
        torch.testing.assert_close(a, r, atol=1e-6, rtol=1e-5)
    model.config.output_attentions = False
    mt.patch(model, covering_table(cfg), attention=True)
    assert model.config._attn_implementation == mt.ATTN and mt.patched(model)["attention"] == 1
    mt.unpatch(model)
    assert model.config._attn_implementation == "eager"


@pytest.mark.parametrize("spec", SPECS)
def test_output_attentions_returns_the_models_own_weights(spec):
    model, plain, cfg = _models(spec)
    assert model.config._attn_implementation == mt.ATTN
    ids, mask = _padded(cfg)
    with torch.no_grad():
        out = model(ids, attention_mask=mask, output_attentions=True)
        ref = plain(ids, attention_mask=mask, output_attentions=True)
        causal = model(ids, output_attentions=True)  # no mask at all: a plain causal prefill
        causal_ref = plain(ids, output_attentions=True)
    B, S = ids.shape
    assert len(out.attentions) == _layers(cfg)
    for a, r in zip(out.attentions, ref.attentions):
        assert a.shape == (B, cfg.num_attention_heads, S, S)
        torch.testing.assert_close(a, r, atol=1e-6, rtol=1e-5)
        assert torch.all(a[1, :, 3:, :3] == 0)  # the padded positions get no weight
    for a, r in zip(causal.attentions, causal_ref.attentions):
        torch.testing.assert_close(a, r, atol=1e-6, rtol=1e-5)
        assert torch.all(a.triu(1) == 0)  # causal
        torch.testing.assert_close(a.sum(-1), torch.ones(a.shape[:-1]))
    torch.testing.assert_close(out.logits[0], ref.logits[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(causal.logits, causal_ref.logits, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("use_cache", [True, False])
@pytest.mark.parametrize("spec", SPECS)
def test_generate_returns_attentions_for_every_step(spec, use_cache):
    model, plain, cfg = _models(spec)
    ids = _ids(cfg)
    kw = dict(max_new_tokens=3, do_sample=False, output_attentions=True,
              return_dict_in_generate=True, use_cache=use_cache,
              attention_mask=torch.ones_like(ids))
    with torch.no_grad():
        out, ref = model.generate(ids, **kw), plain.generate(ids, **kw)
    assert torch.equal(out.sequences, ref.sequences)
    assert len(out.attentions) == 3
    for step, step_ref in zip(out.attentions, ref.attentions):
        assert len(step) == _layers(cfg)
        for a, r in zip(step, step_ref):
            torch.testing.assert_close(a, r, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("spec", SPECS)
def test_gradients_reach_the_returned_attentions(spec):
    model, _, cfg = _models(spec)
    out = model(_ids(cfg), output_attentions=True, output_hidden_states=True)
    hidden, attn = out.hidden_states[0], out.attentions[0]
    hidden.retain_grad()
    attn.retain_grad()
    out.logits.flatten()[0].backward(retain_graph=True)
    assert hidden.grad is not None and attn.grad is not None


@pytest.mark.parametrize("spec", SPECS)
def test_set_attn_implementation_away_from_metaltune_and_back(spec):
    model, plain, cfg = _models(spec)
    ids = _ids(cfg)
    with torch.no_grad():
        ref = plain(ids).logits
    for impl in ("eager", "sdpa", mt.ATTN, "eager"):
        model.set_attn_implementation(impl)
        assert model.config._attn_implementation == impl
        assert all(mod.config._attn_implementation == impl for mod in model.modules()
                   if type(mod).__name__.endswith("Attention"))
        with torch.no_grad():
            torch.testing.assert_close(model(ids).logits, ref, atol=1e-5, rtol=1e-5)
    model.config.output_attentions = True  # eager again: the config flag is allowed
    with torch.no_grad():
        assert len(model(ids).attentions) == _layers(cfg)
    model.config.output_attentions = False
    mt.unpatch(model)
    assert model.config._attn_implementation == "eager"  # the user's later choice is kept


@pytest.mark.parametrize("spec", SPECS)
def test_deepcopy_of_a_patched_model_computes_with_the_copys_weights(spec):
    model, plain, cfg = _models(spec)
    plain.set_attn_implementation("sdpa")
    twin = copy.deepcopy(model)
    assert mt.patched(twin) == mt.patched(model)
    with torch.no_grad():
        for mm in (twin, plain):
            mm.model.norm.weight.mul_(1.7)
            for layer in mm.model.layers:
                layer.mlp.down_proj.weight.mul_(0.5)
                layer.input_layernorm.weight.add_(0.25)
        ids = _ids(cfg)
        torch.testing.assert_close(twin(ids).logits, plain(ids).logits, atol=1e-5, rtol=1e-5)
        assert (model(ids).logits - twin(ids).logits).abs().max() > 0.1  # the original kept its own
    mt.unpatch(twin)
    assert all("forward" not in mm.__dict__ for mm in twin.modules())
    assert mt.patched(model)  # the original is still patched


SAVE = """
import torch
from kernelsearch.integrations import transformers as mt
from tests.hfhelpers import covering_table
from tuner.workloads.hf import HFModel
m = HFModel({spec!r})
mt.patch(m.model, covering_table(m.config))
ids = torch.randint(0, m.config.vocab_size, (2, 7), generator=torch.Generator().manual_seed(0))
with torch.no_grad():
    torch.save({{"model": m.model, "ids": ids, "logits": m.model(ids).logits}}, {path!r})
"""
LOAD = """
import torch
d = torch.load({path!r}, weights_only=False)  # nothing of metaltune imported or registered yet
from kernelsearch.integrations import transformers as mt
assert mt.patched(d["model"]), mt.patched(d["model"])
assert d["model"].config._attn_implementation == mt.ATTN
with torch.no_grad():
    torch.testing.assert_close(d["model"](d["ids"]).logits, d["logits"], atol=1e-5, rtol=1e-5)
print("loaded and computed")
"""


@pytest.mark.parametrize("spec", SPECS)
def test_torch_save_of_a_patched_model_loads_and_computes_in_a_fresh_process(spec, tmp_path):
    # transformers with `kernels` installed makes its own models unpicklable (a local Func class
    # for apply_rotary_pos_emb); USE_HUB_KERNELS=0 is transformers' way to leave them plain
    env = {**os.environ, "PYTHONPATH": REPO, "USE_HUB_KERNELS": "0", "TRITON_INTERPRET": "1"}
    path = str(tmp_path / "patched.pt")
    for script in (SAVE, LOAD):
        r = subprocess.run([sys.executable, "-c", textwrap.dedent(script.format(spec=spec, path=path))],
                           capture_output=True, text=True, env=env, cwd=REPO, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
    assert "loaded and computed" in r.stdout
