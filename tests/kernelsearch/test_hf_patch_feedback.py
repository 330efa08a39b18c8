"""`patch` says what it patched and warns (NothingPatched, a UserWarning, with the reason) when
it patched nothing; and transformers' own kernel route, the real `kernels` 0.16 package's
`kernelize` with metaltune's local layer repository, replaces the marked layers and computes
the plain model's logits. Real transformers 5.17, tiny models on the CPU."""
from __future__ import annotations

import logging
import warnings
from dataclasses import replace

import pytest
import torch

from kernelsearch import dispatch
from kernelsearch.integrations import transformers as mt
from tests.hfhelpers import covering_table
from tuner.workloads.hf import HFModel


@pytest.fixture(autouse=True)
def _clean():
    dispatch.install(None)
    yield
    dispatch.install(None)


def _ids(cfg):
    return torch.randint(0, cfg.vocab_size, (2, 7), generator=torch.Generator().manual_seed(0))


def test_patch_says_what_it_patched_and_does_not_warn(caplog):
    m = HFModel("tiny-llama")
    with warnings.catch_warnings():
        warnings.simplefilter("error", mt.NothingPatched)
        with caplog.at_level(logging.INFO, logger=mt.__name__):
            mt.patch(m.model, covering_table(m.config))
    assert "patched LlamaForCausalLM: mlp x2, rmsnorm x5, rope x1, attention x1" in caplog.text


def _gpt2():
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model("gpt2", n_embd=64, n_layer=2, n_head=4, vocab_size=256, n_positions=64)
    return AutoModelForCausalLM.from_config(cfg).eval()


@pytest.mark.parametrize("case, expect", [
    ("cpu", r"the model is on cpu: the kernels run on CUDA tensors \(or under Triton's interpreter"),
    ("no table", r"no dispatch table: none installed and none shipped for a process without a GPU"),
    ("other gpu", r"the table was tuned and verified on NVIDIA H200, this model runs on cpu"),
    ("uncovered", r"the table \(cpu-interpreter\) has no entry at its dims and dtype \(hidden 64, "
                  r"ffn 128, heads 4/2, head dim 16\)"),
    ("unsupported", r"no module of it is one metaltune replaces"),
])
def test_patch_warns_with_the_reason_when_nothing_was_patched(monkeypatch, case, expect):
    if torch.cuda.is_available():
        pytest.skip("the CPU cases")
    m = None if case == "unsupported" else HFModel("tiny-llama")
    model = _gpt2() if m is None else m.model
    table = covering_table(HFModel("tiny-llama").config)
    if case == "cpu":
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    elif case == "no table":
        table = None
    elif case == "other gpu":
        table = replace(table, device="NVIDIA H200")
    elif case == "uncovered":
        table = replace(table, entries=[replace(e, dtype="bfloat16") for e in table.entries])
    with pytest.warns(mt.NothingPatched, match=expect):
        mt.patch(model, table)
    assert mt.patched(model) == {}
    assert all("forward" not in mod.__dict__ for mod in model.modules())


@pytest.mark.parametrize("spec, norms", [("tiny-llama", 5), ("tiny-qwen2", 5), ("tiny-mistral", 5)])
def test_the_kernels_package_route_kernelizes_with_metaltunes_layers(spec, norms):
    import kernels
    from transformers import DynamicCache

    assert kernels.__version__.startswith("0.16.")  # what transformers 5.17 accepts
    m = HFModel(spec)
    model, cfg = m.model, m.config
    ids = _ids(cfg)
    with torch.no_grad():
        ref = model(ids, past_key_values=DynamicCache(config=cfg), use_cache=True)
        nxt = ref.logits[:, -1:].argmax(-1)
        ref_step = model(nxt, past_key_values=ref.past_key_values, use_cache=True).logits
    with warnings.catch_warnings():
        warnings.simplefilter("error", mt.NothingPatched)
        assert mt.use_kernels(model, covering_table(cfg)) is model
    assert mt.patched(model) == {"kernels:RMSNorm": norms, "kernels:rotary_pos_emb": 1}
    s0 = dispatch.stats()["kernel"]
    with torch.no_grad():
        out = model(ids, past_key_values=DynamicCache(config=cfg), use_cache=True)
        step = model(nxt, past_key_values=out.past_key_values, use_cache=True).logits
    calls = dispatch.stats()["kernel"] - s0
    # prefill: every norm; the decode step: every norm and each layer's rotary (one launch)
    assert calls == 2 * norms + cfg.num_hidden_layers, calls
    torch.testing.assert_close(out.logits, ref.logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(step, ref_step, atol=1e-5, rtol=1e-5)
    mt.unpatch(model)
    assert all("forward" not in mod.__dict__ for mod in model.modules())
    with torch.no_grad():
        assert torch.equal(model(ids).logits, ref.logits)


def test_a_plain_script_sees_what_patch_replaced(tmp_path):
    """Issue 33: the success line was logged at INFO, which a script that never set up logging
    does not show (its failure, a UserWarning, did show). A user's script, as a child process."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    script = tmp_path / "user.py"
    script.write_text(
        "from kernelsearch.integrations.transformers import patch\n"
        "from tests.hfhelpers import covering_table\n"
        "from tuner.workloads.hf import HFModel\n"
        "m = HFModel('tiny-llama')  # a tiny Llama with random weights\n"
        "patch(m.model, covering_table(m.config))\n")
    env = {**os.environ, "PYTHONPATH": str(root), "TRITON_INTERPRET": "1"}
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env,
                       cwd=root, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "metaltune: patched LlamaForCausalLM: mlp x2, rmsnorm x5, rope x1, attention x1" in r.stderr, \
        r.stderr[-2000:]
