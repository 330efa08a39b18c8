"""Library variants: discovery (present / absent / broken import), selection, the fallback order,
table entries that name library variants, and the second yardstick (the best library kernel).

The real libraries (FlashMLA, flash-attn) run only on a GPU, so these tests write STAND-INS: small
packages with the libraries' module names and call signatures, computing in plain torch on the
CPU, put on sys.path from a temp dir and imported by the real import machinery. They test
metaltune's plumbing (discovery, the shipped wrappers and their layout adapters, the judge's
library mode, the table, dispatch's lookup), never the libraries' kernels: those are measured on
the H200 (benchmarks/results/library-h200-*)."""
import json
import sys
import textwrap

import pytest
import torch

from kernelsearch import dispatch, libraries
from kernelsearch.families import get, library
from kernelsearch.table import FALLBACK, DispatchTable, Entry, plan

# a stand-in for FlashMLA's Python interface (flash_mla): the same functions and argument
# order, computed with torch on whatever device the tensors are on, and refusing what the
# real kernels fault on (on the H200 an unaligned or strided view is a SIGSEGV in the TMA
# descriptor or a misaligned-address error: the judge's offset/unaligned/strided views found it)
STANDIN_FLASH_MLA = '''
"""STAND-IN for deepseek-ai/FlashMLA's flash_mla package (tests only): torch on the CPU."""
import torch
__version__ = "0.0-standin"

class _Meta:
    pass

def _dense_aligned(*ts):
    for t in ts:
        if not t.is_contiguous() or t.data_ptr() % 16:
            raise RuntimeError("TMA Desc Addr: input not dense and 16-byte aligned (stand-in)")

def get_mla_metadata(*a, **k):
    return _Meta(), None

def _attend(q, kv, mask, scale):  # q [H, 576], kv [N, 576], mask [N]
    s = (q.float() @ kv.float().T) * scale
    s = s.masked_fill(~mask[None, :], float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    return (p @ kv[:, :512].float()).to(q.dtype)

def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v, meta,
                           num_splits=None, softmax_scale=None, causal=False, **kw):
    _dense_aligned(q, k_cache, block_table, cache_seqlens)
    if k_cache.shape[1] != 64:
        raise RuntimeError("Currently page_block_size must be 64")
    B, S, H, D = q.shape
    page = k_cache.shape[1]
    out = []
    for b in range(B):
        kv = k_cache[block_table[b].long()].reshape(-1, D)
        mask = torch.arange(kv.shape[0]) < int(cache_seqlens[b])
        out.append(_attend(q[b, 0], kv, mask, softmax_scale))
    return torch.stack(out)[:, None], None

def flash_mla_sparse_fwd(q, kv, indices, sm_scale, d_v=512, **kw):
    _dense_aligned(q, kv, indices)
    if indices.shape[-1] % 128:  # an assertion in the real kernel: a SIGSEGV on the H200
        raise RuntimeError("topk must be a multiple of 128")
    rows = kv.reshape(-1, kv.shape[-1])
    out = []
    for b in range(q.shape[0]):
        idx = indices[b, 0].long()
        ok = idx >= 0
        out.append(_attend(q[b], rows[idx.clamp_min(0)], ok, sm_scale))
    return torch.stack(out), None, None
'''

# a stand-in for flash-attn's flash_attn_with_kvcache (q [B, 1, HQ, D], caches [B, L, HKV, D])
STANDIN_FLASH_ATTN = '''
"""STAND-IN for Dao-AILab/flash-attention's flash_attn (tests only): torch SDPA."""
import torch
import torch.nn.functional as F
__version__ = "0.0-standin"

def flash_attn_with_kvcache(q, k_cache, v_cache, **kw):
    q4, k4, v4 = q.transpose(1, 2), k_cache.transpose(1, 2), v_cache.transpose(1, 2)
    o = F.scaled_dot_product_attention(q4.float(), k4.float(), v4.float(),
                                       enable_gqa=q4.shape[1] != k4.shape[1])
    return o.to(q.dtype).transpose(1, 2)
'''


def _install(tmp_path, monkeypatch, name, text):
    pkg = tmp_path / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(tmp_path))
    return pkg


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    """Every test starts with nothing discovered and no stand-in left imported."""
    for m in ("flash_mla", "flash_mla.cuda", "flash_attn"):
        monkeypatch.delitem(sys.modules, m, raising=False)
    monkeypatch.delenv(libraries.FLASHMLA_EXT_ENV, raising=False)
    libraries.reset()
    dispatch.install(None)
    yield
    dispatch.install(None)
    libraries.reset()
    for m in ("flash_mla", "flash_mla.cuda", "flash_attn"):
        sys.modules.pop(m, None)


@pytest.fixture
def flash_mla(tmp_path, monkeypatch):
    _install(tmp_path, monkeypatch, "flash_mla", STANDIN_FLASH_MLA)


@pytest.fixture
def flash_attn(tmp_path, monkeypatch):
    _install(tmp_path, monkeypatch, "flash_attn", STANDIN_FLASH_ATTN)


# -- discovery ---------------------------------------------------------------------------------
def test_absent_library_is_not_offered():
    f = libraries.discover("flash_mla")
    assert f.status == "absent" and not f.present and "flash_mla" in f.reason
    fam = get("mla_decode")
    assert "flashmla" in fam.variants  # known, so a table naming it loads ...
    assert ("flashmla", {}) not in fam.space((2, 16, 130, 64, 0))  # ... but never a choice
    assert library.offered(fam, (2, 16, 130, 64, 0)) == []


def test_present_library_is_offered_where_it_fits(flash_mla):
    f = libraries.discover("flash_mla")
    assert f.present and f.version == "0.0-standin"
    fam = get("mla_decode")
    assert ("flashmla", {}) in fam.space((2, 16, 130, 64, 0))
    assert ("flashmla", {}) not in fam.space((2, 16, 130, 16, 0))  # FlashMLA pages are 64
    assert library.offered(fam, (2, 16, 130, 64, 0), "bfloat16") == ["flashmla"]
    assert library.offered(fam, (2, 16, 130, 64, 0), "float16") == []  # its dtypes only
    sparse = get("mla_sparse_decode")
    assert library.offered(sparse, (2, 128, 300, 16, 2048, 0)) == ["flashmla_sparse"]
    assert library.offered(sparse, (2, 128, 300, 16, 64, 0)) == []  # topk: blocks of 128


def test_broken_import_is_not_offered_and_says_why(tmp_path, monkeypatch):
    _install(tmp_path, monkeypatch, "flash_mla",
             'raise ImportError("libcudart.so.13: cannot open shared object file")\n')
    f = libraries.discover("flash_mla")
    assert f.status == "broken" and "libcudart.so.13" in f.reason
    assert library.offered(get("mla_decode"), (2, 16, 130, 64, 0)) == []
    rep = {x["name"]: x for x in libraries.report()}
    assert rep["flash_mla"]["status"] == "broken" and "libcudart" in rep["flash_mla"]["reason"]
    assert rep["flashinfer"]["install"] == "pip install flashinfer-python"


def test_flashmla_extensions_named_in_the_environment_become_flash_mla_cuda(tmp_path,
                                                                           monkeypatch):
    """A FlashMLA built as separate extensions (one per part): $METALTUNE_FLASHMLA_EXT names
    them and their *_fwd functions are what `flash_mla.cuda` holds when the interface imports.
    (A .py file stands in for the .so: the same import machinery loads both.)"""
    _install(tmp_path, monkeypatch, "flash_mla",
             'import flash_mla.cuda as _cuda\n__version__ = "x"\n'
             'def dense():\n    return _cuda.dense_decode_fwd()\n')
    part = tmp_path / "dense_part.py"
    part.write_text("def dense_decode_fwd():\n    return 'from the part'\n")
    monkeypatch.setenv(libraries.FLASHMLA_EXT_ENV, str(part))
    f = libraries.discover("flash_mla")
    assert f.present, f.reason
    assert f.module.dense() == "from the part"
    assert libraries.FLASHMLA_EXT_ENV in f.where


def test_host_probe_imports_nothing(tmp_path, monkeypatch):
    _install(tmp_path, monkeypatch, "flash_mla", 'raise RuntimeError("imported")\n')
    p = libraries.probe("flash_mla")
    assert p["status"] == "found" and "flash_mla" not in sys.modules


# -- the judge's library mode ------------------------------------------------------------------
def _judge(family, source, **kw):
    from kernelsearch.harness.judge import judge

    return judge(family, source, {}, device="cpu", timing=False, random_shapes=1, seeds=1, **kw)


def test_library_variant_goes_through_the_judge_and_says_so(flash_mla):
    fam = get("mla_decode")
    v = _judge("mla_decode", fam.variants["flashmla"].file.read_text(), library="flash_mla")
    assert v.accepted, v.detail
    assert v.kind == "library" and v.library["name"] == "flash_mla"
    assert v.library["version"] == "0.0-standin"
    # checked at the family's boundary lengths, through FlashMLA's page of 64
    assert v.checked_shapes and all(s[3] == 64 for s in v.checked_shapes)
    assert any(s[2] == 257 for s in v.checked_shapes)


def test_library_wrappers_hand_flashmla_dense_aligned_inputs(flash_mla):
    """The judge's views (offset, unaligned, row-strided, transposed) reach the wrappers as a
    user's tensors may; FlashMLA faults on all but dense aligned ones, so the adapter copies
    those (and only those) and the answer is the reference's."""
    from kernelsearch.families import flashmla_layouts as fl
    from kernelsearch.families.base import relayout

    x = torch.randn(4, 3, 576)
    assert fl.aligned(x) is x  # the timed case: no copy
    for kind in ("offset", "unaligned", "row_strided", "transposed"):
        v = relayout(x, kind)
        a = fl.aligned(v)
        assert a.is_contiguous() and a.data_ptr() % 16 == 0 and torch.equal(a, x), kind
    fam = get("mla_decode")
    q, kv, bt, lens, scale = fam.make_inputs((2, 16, 130, 64, 1), torch.float32, "cpu",
                                             torch.Generator().manual_seed(0), "normal")
    ref = fam.torch_default(q, kv, bt, lens, scale)
    out = library.forward("mla_decode", "flashmla")(relayout(q, "unaligned"),
                                                     relayout(kv, "unaligned"),
                                                     relayout(bt, "row_strided"), lens, scale)
    assert torch.allclose(out.float(), ref.float(), atol=1e-3, rtol=1e-3)


def test_sparse_library_variant_is_judged_through_its_physical_rows_adapter(flash_mla):
    fam = get("mla_sparse_decode")
    v = _judge("mla_sparse_decode", fam.variants["flashmla_sparse"].file.read_text(),
               library="flash_mla")
    assert v.accepted, v.detail
    assert v.kind == "library"


def test_a_wrong_library_kernel_is_rejected(tmp_path, monkeypatch):
    """The judge checks the library's output like any kernel's: a FlashMLA that ignores the
    lengths (reads poisoned rows past them) fails correctness."""
    _install(tmp_path, monkeypatch, "flash_mla",
             STANDIN_FLASH_MLA.replace("< int(cache_seqlens[b])", "< 10 ** 9"))
    fam = get("mla_decode")
    v = _judge("mla_decode", fam.variants["flashmla"].file.read_text(), library="flash_mla")
    assert not v.accepted and v.code == "incorrect"


def test_only_a_shipped_wrapper_may_skip_the_guard(flash_mla):
    src = get("mla_decode").variants["flashmla"].file.read_text() + "\n# changed\n"
    v = _judge("mla_decode", src, library="flash_mla")
    assert not v.accepted and v.rule == "library_claim"


def test_library_absent_is_a_verdict():
    v = _judge("mla_decode", get("mla_decode").variants["flashmla"].file.read_text(),
               library="flash_mla")
    assert not v.accepted and v.rule == "library_unavailable" and v.kind == "library"


def test_verdict_carries_the_library_yardstick(flash_attn):
    """A Triton kernel's timing is A/B-ed against the best library kernel at the shape too."""
    from kernelsearch.harness.judge import judge

    fam = get("decode_attention")
    shape = (1, 2, 1, 20, 64)
    cfg = {"BLOCK_N": 16, "SPLIT": 128, "STAGES": 1, "num_warps": 2}
    v = judge("decode_attention", fam.variants["splitkv"].file.read_text(), cfg, device="cpu",
              shapes=[shape], timing_shapes=[shape], random_shapes=0, seeds=1, reps=2,
              boundary=False)
    assert v.accepted, v.detail
    t = next(iter(v.timings.values()))
    assert t["library"] == "flash_attn" and t["speedup_vs_library"] > 0
    assert v.summary["library"] == ["flash_attn"]
    assert v.summary["speedup_vs_library_min"] == t["speedup_vs_library"]


# -- table: fallback order, entries naming library variants, the yardstick in plan -------------
MLA_DIMS = {"B": 2, "H": 16, "L": 130, "P": 64, "R": 1}


def _tma_entry(lo, hi):
    return Entry("mla_decode", "bfloat16", {"H": 16, "P": 64}, {"B": [1, 8], "L": [lo, hi]},
                 "splitkv", {"BLOCK_H": 16, "BLOCK_N": 16, "GRID": 132, "STAGES": 1,
                             "num_warps": 4})


def test_fallback_order_is_table_then_library_then_torch(flash_mla):
    assert FALLBACK == ("table", "library", "torch")
    t = DispatchTable([_tma_entry(100, 200)])
    assert t.choose("mla_decode", "bfloat16", MLA_DIMS)[0::2] == ("table", "splitkv")
    outside = dict(MLA_DIMS, L=1000)
    assert t.choose("mla_decode", "bfloat16", outside) == ("library", None, "flashmla")
    assert t.choose("mla_decode", "bfloat16", dict(outside, P=16)) == ("torch", None, None)


def test_entry_measured_behind_the_library_gives_way_where_it_is_found(flash_mla):
    """A table shipped or built without the library (h200-mla.json's entries measured at
    0.4-0.8x FlashMLA) must not override it on a host that has it; one measured faster keeps
    its place, and so does every entry on a host without the library."""
    import dataclasses

    slow = dataclasses.replace(_tma_entry(100, 200), speedup_vs_library=0.8)
    fast = dataclasses.replace(_tma_entry(100, 200), speedup_vs_library=1.16)
    near = dataclasses.replace(_tma_entry(100, 200), speedup_vs_library=1.01)  # in the noise
    assert DispatchTable([slow]).choose("mla_decode", "bfloat16", MLA_DIMS) == \
        ("library", None, "flashmla")
    assert DispatchTable([near]).choose("mla_decode", "bfloat16", MLA_DIMS)[0] == "library"
    assert DispatchTable([fast]).choose("mla_decode", "bfloat16", MLA_DIMS)[0::2] == \
        ("table", "splitkv")
    # where the library does not take the shape (page 16), the entry still runs
    other = dataclasses.replace(slow, match=dict(slow.match, P=16))
    assert DispatchTable([other]).choose("mla_decode", "bfloat16", dict(MLA_DIMS, P=16))[0] \
        == "table"


def test_entry_behind_the_library_runs_where_the_library_is_absent():
    import dataclasses

    slow = dataclasses.replace(_tma_entry(100, 200), speedup_vs_library=0.8)
    assert DispatchTable([slow]).choose("mla_decode", "bfloat16", MLA_DIMS)[0::2] == \
        ("table", "splitkv")


def test_fallback_without_the_library_is_torch():
    t = DispatchTable([_tma_entry(100, 200)])
    assert t.choose("mla_decode", "bfloat16", dict(MLA_DIMS, L=1000)) == ("torch", None, None)


def test_table_entry_naming_a_library_variant_round_trips_and_needs_its_library(flash_mla):
    d = {"entries": [{"family": "mla_decode", "dtype": "bfloat16", "match": {"H": 16, "P": 64},
                      "ranges": {"B": [1, 8], "L": [1, 4096]}, "variant": "flashmla",
                      "config": {}, "speedup": 3.0, "speedup_vs_library": 1.0}]}
    t = DispatchTable.from_dict(d)
    assert t.entries[0].variant == "flashmla" and t.entries[0].speedup_vs_library == 1.0
    assert json.loads(json.dumps(t.to_dict()))["entries"][0]["variant"] == "flashmla"
    assert t.choose("mla_decode", "bfloat16", MLA_DIMS)[0::2] == ("table", "flashmla")
    sys.modules.pop("flash_mla")
    libraries.reset()
    import importlib

    monkey_path = [p for p in sys.path if (__import__("pathlib").Path(p) / "flash_mla").is_dir()]
    for p in monkey_path:
        sys.path.remove(p)
    importlib.invalidate_caches()
    try:  # the library gone: its entry is skipped, torch runs
        assert t.choose("mla_decode", "bfloat16", MLA_DIMS) == ("torch", None, None)
    finally:
        sys.path[:0] = monkey_path


class _OnCuda(torch.Tensor):
    """A CPU tensor that says it is on CUDA: dispatch hands the library fallback CUDA tensors
    only, and the stand-in computes anywhere."""

    @property
    def is_cuda(self):
        return True


def test_a_call_no_entry_covers_runs_the_library_through_dispatch(flash_mla, monkeypatch):
    """An installed table (even an empty one) runs the best library kernel where no entry
    covers the call: the mixed search's "torch" slots and every replayed table rely on it."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # dispatch takes CPU tensors under it
    fam = get("mla_decode")
    q, kv, bt, lens, scale = fam.make_inputs((2, 16, 130, 64, 1), "bfloat16", "cpu",
                                             torch.Generator().manual_seed(0))
    ran = []
    real = library.forward("mla_decode", "flashmla")
    monkeypatch.setattr(sys.modules["kernelsearch.families.mla_decode.flashmla"], "forward",
                        lambda *a: ran.append(1) or real(*a))
    dispatch.install(DispatchTable([]))
    out = dispatch.call("mla_decode", q.as_subclass(_OnCuda), kv, bt, lens, scale)
    assert ran == [1]  # the library's wrapper ran, not torch
    ref = fam.reference(q, kv, bt, lens, scale)
    assert torch.allclose(out.float(), ref.float(), atol=2e-2, rtol=2e-2)
    dispatch.install(None)  # no table: torch, the library is not asked
    dispatch.call("mla_decode", q.as_subclass(_OnCuda), kv, bt, lens, scale)
    assert ran == [1]


def _row(L, t_us, lib_us, variant="splitkv"):
    return {"shape": [2, 16, L, 64, 0], "dtype": "bfloat16", "variant": variant,
            "config": {} if variant == "flashmla" else _tma_entry(1, 2).config,
            "time_s": t_us * 1e-6, "baseline_s": 1000e-6, "library_variant": "flashmla",
            "library_s": lib_us * 1e-6}


def test_plan_keeps_a_searched_kernel_only_where_it_beats_the_library():
    rows = [_row(1024, 50, 100),  # searched 2x faster than the library: kept
            _row(4096, 99, 100),  # within the 2% margin: the library's entry
            _row(16384, 300, 100)]  # slower than the library: the library's entry
    es = plan("mla_decode", rows)
    by_l = {e.measured[0]["shape"][2]: e for e in es}
    assert by_l[1024].variant == "splitkv" and by_l[1024].speedup_vs_library == pytest.approx(2.0)
    assert by_l[4096].variant == "flashmla" and by_l[4096].config == {}
    assert by_l[4096].speedup_vs_library == pytest.approx(1.0)
    assert by_l[4096].measured[0]["library_us"] == pytest.approx(100)
    # neighbouring library cells merge into one entry
    assert len([e for e in es if e.variant == "flashmla"]) == 1
    assert by_l[1024].ranges["L"][1] < by_l[4096].ranges["L"][0]


def test_plan_without_a_library_keeps_the_torch_rule():
    rows = [dict(_row(1024, 50, 100), library_s=None, library_variant=None)]
    (e,) = plan("mla_decode", rows)
    assert e.variant == "splitkv" and e.speedup_vs_library is None and e.speedup == pytest.approx(20.0)


def test_kernel_search_space_offers_a_library_only_where_found(flash_mla):
    from tuner.search.kernel import kernel_space

    shape = (2, 16, 130, 64, 0)
    assert "flashmla" in kernel_space("mla_decode", shape).dims[0].values
    assert "flashmla" not in kernel_space("mla_decode", (2, 16, 130, 16, 0)).dims[0].values


def test_dispatch_hands_cpu_tensors_to_torch_even_with_a_library(flash_mla):
    """FlashMLA runs on the GPU only: a CPU call outside the table is the torch op, counted."""
    fam = get("mla_decode")
    args = fam.make_inputs((2, 16, 130, 64, 1), "bfloat16", "cpu", torch.Generator().manual_seed(0))
    dispatch.install(DispatchTable([]))
    assert dispatch.resolve("mla_decode", *args) is None


# -- the command line: `kernel families` lists the libraries, `kernel check` judges a wrapper --
def _cli(tmp_path, *args, pythonpath=""):
    import os
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(x for x in (str(root), pythonpath) if x),
               TRITON_INTERPRET="1", KERNELSEARCH_SANDBOX_USER="none")
    return subprocess.run([sys.executable, "-m", "tuner", "--state-dir", str(tmp_path / "st"),
                           *args], capture_output=True, text=True, cwd=root, env=env,
                          timeout=600)


def test_kernel_families_lists_libraries_found_and_broken(tmp_path):
    (tmp_path / "lib" / "flash_mla").mkdir(parents=True)
    (tmp_path / "lib" / "flash_mla" / "__init__.py").write_text(STANDIN_FLASH_MLA)
    (tmp_path / "lib" / "flash_attn").mkdir()
    (tmp_path / "lib" / "flash_attn" / "__init__.py").write_text(
        'raise OSError("undefined symbol: _ZN3c10")\n')
    p = _cli(tmp_path, "kernel", "families", "--json", pythonpath=str(tmp_path / "lib"))
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    libs = {x["name"]: x for x in d["libraries"]}
    assert libs["flash_mla"]["status"] == "present" and libs["flash_mla"]["version"] == "0.0-standin"
    assert libs["flash_attn"]["status"] == "broken" and "_ZN3c10" in libs["flash_attn"]["reason"]
    assert libs["flashinfer"]["status"] == "absent"
    mla = next(f for f in d["families"] if f["family"] == "mla_decode")
    assert mla["library_variants"][0]["variant"] == "flashmla"
    p = _cli(tmp_path, "kernel", "families", pythonpath=str(tmp_path / "lib"))
    assert "flashmla (library, present)" in p.stdout and "library flash_attn: broken" in p.stdout


def test_kernel_check_judges_a_shipped_wrapper_in_a_child_as_a_library(tmp_path):
    (tmp_path / "lib" / "flash_mla").mkdir(parents=True)
    (tmp_path / "lib" / "flash_mla" / "__init__.py").write_text(STANDIN_FLASH_MLA)
    wrapper = get("mla_decode").variants["flashmla"].file
    p = _cli(tmp_path, "kernel", "check", "--family", "mla_decode", "--candidate", str(wrapper),
             "--device", "cpu", "--no-timing", "--json", pythonpath=str(tmp_path / "lib"))
    assert p.returncode == 0, p.stdout + p.stderr
    d = json.loads(p.stdout)
    assert d["verdict"] == "accepted" and d["kind"] == "library"
    assert d["library"]["name"] == "flash_mla" and d["checks"][0].startswith("library")


def test_fp8_rows_hold_the_v32_layout():
    """656 bytes a token: 512 e4m3 values in four scaled tiles, then the 64 rope values in
    bf16 unchanged; dequantized within e4m3's precision."""
    from kernelsearch.families import flashmla_layouts as fl

    x = torch.randn(5, 576, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    r = fl.fp8_rows(x)
    assert r.shape == (5, 656) and r.dtype == torch.uint8
    back = fl.fp8_dequantize(r)
    assert torch.equal(back[:, 512:], x[:, 512:])  # rope kept exactly
    err = (back[:, :512].float() - x[:, :512].float()).abs().max() / x[:, :512].float().abs().max()
    assert err < 0.07  # e4m3 keeps 3 mantissa bits
    c = fl.fp8_cache(x.view(1, 5, 576))
    assert c.shape == (1, 5, 1, 656) and torch.equal(c.view(5, 656), r)


def test_mixed_search_slots_offer_the_library_kernel(flash_mla):
    """With no entry the slot's "torch" choice runs the library already (no second choice for
    it: tests/search/test_mixed_library_noop.py); over a Triton entry it is offered by name."""
    from tuner.search.mixed.space import TORCH, kernel_slots

    calls = [("mla_decode", "bfloat16", (2, 16, 130, 64, 1))]
    (s,) = kernel_slots(calls, None, max_choices=3)
    assert s.choices[0] == TORCH and s.runs(TORCH) == "flashmla{}" and "flashmla{}" not in s.choices
    (s,) = kernel_slots(calls, None, max_choices=3,
                        start_table=DispatchTable([_tma_entry(100, 200)]))
    assert s.choices[0] == "flashmla{}" and s.choices[1].startswith("splitkv")


def test_search_summary_reports_both_yardsticks():
    from tuner.search.kernel import summary

    res = {"run_id": "r", "family": "mla_decode", "device": "cuda", "proposer": "grid",
           "table": "t.json", "entries": 1,
           "buckets": [{"shape": [8, 128, 131072, 64, 0],
                        "best": {"variant": "tma", "speedup_vs_torch": 2.9,
                                 "speedup_vs_library": 0.43, "library": "flashmla"}}]}
    (b,) = summary(res)["buckets"]
    assert (b["speedup_vs_torch"], b["speedup_vs_library"], b["library"]) == (2.9, 0.43, "flashmla")
