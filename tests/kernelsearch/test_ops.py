"""Every family as a torch custom op (kernelsearch.ops): generated from the registry, opcheck'd
with a table that covers the tiny shapes (so the Triton kernels run, under the interpreter),
the torch default outside the table, and no graph break under torch.compile(fullgraph=True)."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import kernelsearch.ops as kops
from kernelsearch import dispatch
from kernelsearch.families import NAMES, get
from kernelsearch.table import DispatchTable, Entry


def _dtype(fam) -> str:
    # the interpreter's bf16 dot is not faithful: float32 where the family takes it, else fp16
    return "float32" if "float32" in fam.dtypes else "float16"


def _entry_for(fam, shape, dtype) -> Entry:
    """An entry at exactly this shape with the first config some variant accepts there."""
    dims = fam.dims_dict(shape)
    for name, var in fam.variants.items():
        cfgs = var.configs(shape)
        if cfgs:
            return Entry(fam.name, dtype, {k: dims[k] for k in fam.exact_dims},
                         {k: [dims[k], dims[k]] for k in fam.range_dims}, name, cfgs[0])
    raise AssertionError(f"{fam.name}: no variant takes {shape}")


@pytest.fixture
def clean_table():
    yield
    dispatch.install(None)


def test_an_op_for_every_family_in_the_registry():
    ops = kops.register_all()
    assert kops.skipped == {}
    for name in NAMES:
        assert name in ops
        assert hasattr(torch.ops.metaltune, name)
    # the schema comes from the family's signature and its inputs' types
    assert kops.schema_of(get("rmsnorm")) == "(Tensor x, Tensor weight, float eps) -> Tensor"
    assert kops.schema_of(get("decode_attention")) == "(Tensor q, Tensor k, Tensor v) -> Tensor"
    assert str(torch.ops.metaltune.rope.default._schema).startswith("metaltune::rope(Tensor x,")


@pytest.mark.parametrize("name", NAMES)
def test_opcheck_passes_with_the_kernel_running(name, clean_table):
    fam = get(name)
    shape, dt = fam.tiny_shapes[0], _dtype(fam)
    args = fam.make_inputs(shape, dt, "cpu", torch.Generator().manual_seed(0))
    dispatch.install(DispatchTable([_entry_for(fam, shape, dt)]))
    before = dispatch.stats()
    out = getattr(torch.ops.metaltune, name)(*args)
    after = dispatch.stats()
    assert after["kernel"] - before["kernel"] == 1 and after["fallback"] == before["fallback"]
    ref = fam.reference(*args)
    atol, rtol, _ = fam.tolerance(dt)
    torch.testing.assert_close(out.double(), ref, atol=atol * 4, rtol=rtol * 4)
    torch.library.opcheck(getattr(torch.ops.metaltune, name), args)
    assert dispatch.stats()["kernel"] > after["kernel"]  # opcheck's runs went to the kernel too


@pytest.mark.parametrize("name", NAMES)
def test_outside_the_table_the_op_is_the_torch_default(name, clean_table):
    fam = get(name)
    args = fam.make_inputs(fam.tiny_shapes[0], _dtype(fam), "cpu", torch.Generator().manual_seed(1))
    dispatch.install(None)
    before = dispatch.stats()["fallback"]
    out = getattr(torch.ops.metaltune, name)(*args)
    assert dispatch.stats()["fallback"] == before + 1
    assert torch.equal(out, fam.torch_default(*args).contiguous())
    torch.library.opcheck(getattr(torch.ops.metaltune, name), args)


def test_backward_is_the_torch_defaults_gradient(clean_table):
    fam = get("rmsnorm")
    x, w, eps = fam.make_inputs((5, 300), "float32", "cpu", torch.Generator().manual_seed(2))
    dispatch.install(DispatchTable([_entry_for(fam, (5, 300), "float32")]))
    xa, wa = x.clone().requires_grad_(), w.clone().requires_grad_()
    xb, wb = x.clone().requires_grad_(), w.clone().requires_grad_()
    g = torch.randn(5, 300)
    torch.autograd.backward(torch.ops.metaltune.rmsnorm(xa, wa, eps), g)
    torch.autograd.backward(fam.torch_default(xb, wb, eps), g)
    torch.testing.assert_close(xa.grad, xb.grad)
    torch.testing.assert_close(wa.grad, wb.grad)
    torch.library.opcheck(torch.ops.metaltune.rmsnorm, (xa.detach().requires_grad_(), wa, eps))


def _cache_inputs(B=2, HQ=4, HKV=2, L=300, D=16, filled=(170, 90), holes=True, seed=3):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, HQ, D, generator=g)
    k = torch.randn(B, HKV, L, D, generator=g)
    v = torch.randn(B, HKV, L, D, generator=g)
    valid = torch.zeros(B, L, dtype=torch.bool)
    for b, n in enumerate(filled):
        valid[b, :n] = True
    if holes:
        valid[1, :7] = False  # left padding of the second sequence
    return q, k, v, valid


def _attn_table(L=300) -> DispatchTable:
    # SPLIT 128 over 300 positions: 3 chunks, the last one past both fills (read nothing)
    return DispatchTable([Entry("decode_attention", "float32", {"HQ": 4, "HKV": 2, "D": 16},
                                {"B": [1, 2], "L": [L, L]}, "flashdec",
                                {"BLOCK_N": 32, "SPLIT": 128, "STAGES": 2, "num_warps": 4})])


def test_static_cache_attention_reads_the_filled_positions_with_the_mask(clean_table):
    q, k, v, valid = _cache_inputs()
    dispatch.install(_attn_table())
    before = dispatch.stats()["kernel"]
    out = torch.ops.metaltune.decode_attention_cache(q, k, v, valid)
    assert dispatch.stats()["kernel"] == before + 1
    torch.testing.assert_close(out, kops.cache_attention_torch(q, k, v, valid), atol=2e-6, rtol=1e-5)
    # NaN past the filled positions changes nothing (never read: 0 * NaN would show), and
    # masked-out positions inside the fill weigh zero
    k2, v2 = k.clone(), v.clone()
    k2[0, :, 170:], v2[0, :, 170:] = float("nan"), float("nan")
    k2[1, :, 90:], v2[1, :, 90:] = float("nan"), float("nan")
    k2[1, :, :7], v2[1, :, :7] = 1e4, 1e4
    torch.testing.assert_close(torch.ops.metaltune.decode_attention_cache(q, k2, v2, valid), out,
                               atol=2e-6, rtol=1e-5)
    torch.library.opcheck(torch.ops.metaltune.decode_attention_cache, (q, k, v, valid))
    torch.library.opcheck(torch.ops.metaltune.decode_attention_cache, (q, k, v, None))
    # a mask broadcast over the batch ([1, L]) and no mask at all
    one = valid[:1]
    torch.testing.assert_close(torch.ops.metaltune.decode_attention_cache(q, k, v, one),
                               kops.cache_attention_torch(q, k, v, one.expand(2, -1)),
                               atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(torch.ops.metaltune.decode_attention_cache(q, k, v, None),
                               kops.cache_attention_torch(q, k, v, None), atol=2e-6, rtol=1e-5)


def test_static_cache_attention_outside_the_table_is_sdpa_with_the_mask(clean_table):
    q, k, v, valid = _cache_inputs(L=200)
    dispatch.install(_attn_table(L=300))  # another length: not covered
    before = dispatch.stats()["fallback"]
    out = torch.ops.metaltune.decode_attention_cache(q, k, v, valid)
    assert dispatch.stats()["fallback"] == before + 1
    assert torch.equal(out, kops.cache_attention_torch(q, k, v, valid))


def test_fullgraph_compile_keeps_the_ops_in_one_graph(clean_table):
    q, k, v, valid = _cache_inputs()
    fam = get("rmsnorm")
    dispatch.install(DispatchTable(_attn_table().entries + [
        Entry("rmsnorm", "float32", {"cols": 16}, {"rows": [1, 64]}, "row",
              {"ROWS": 1, "num_warps": 1})]))
    w = torch.rand(16) + 0.5
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm

    def step(q, k, v, valid):
        a = torch.ops.metaltune.decode_attention_cache(q, k, v, valid)
        return torch.ops.metaltune.rmsnorm(a * 2.0, w, 1e-6) + 1.0

    fn = torch.compile(step, fullgraph=True, backend=backend)
    before = dispatch.stats()["kernel"]
    out = fn(q, k, v, valid)
    assert dispatch.stats()["kernel"] == before + 2
    assert len(graphs) == 1
    code = graphs[0].code
    assert "metaltune.decode_attention_cache" in code and "metaltune.rmsnorm" in code
    ref = fam.torch_default(kops.cache_attention_torch(q, k, v, valid) * 2.0, w, 1e-6) + 1.0
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    expl = torch._dynamo.explain(step)(q, k, v, valid)
    assert expl.graph_break_count == 0 and expl.graph_count == 1


def test_kernelsearch_imports_without_transformers():
    code = ("import sys; sys.modules['transformers'] = None\n"
            "import kernelsearch, kernelsearch.dispatch, kernelsearch.ops\n"
            "import kernelsearch.integrations.transformers as mt\n"
            "try:\n    mt.patch(object())\nexcept ImportError as e:\n    print('hint:', e)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "pip install 'metaltune[hf]'" in r.stdout
